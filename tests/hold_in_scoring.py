"""`python tests/hold_in_scoring.py FD SCRIPT ARGS...`: run SCRIPT (run.py) as `python SCRIPT ARGS...` would, in
this process, and hold it in the middle of its scoring: right after the first forward batch is committed to the
result cache, write one line to the file descriptor FD (the write end of a pipe the caller passed), close FD, and
wait there until a signal ends the wait. A test that sends SIGINT once it read the line interrupts the run at this
known point, while the experiment is scoring (run.py names it as running), however fast or slow the machine is.

The real ResultCache.put_batch runs and commits first; the wait follows it, as a Ctrl-C between two batches would
find the run. Nothing is printed on the run's stdout or stderr. A run that never commits a batch (it failed, or the
result cache served every batch) never writes the line: FD closes when it exits, so the caller reads EOF. The wait
is bounded (HOLD_S): when no signal comes the run goes on and exits as it would have, so an abandoned run ends."""
import faulthandler
import os
import runpy
import signal
import sys
import time
from pathlib import Path

HOLD_S = 600


def main():
    # a caller whose SIGINT went unanswered sends SIGUSR1: where each thread is, on stderr, before it kills the run
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    fd, script, args = int(sys.argv[1]), Path(sys.argv[2]).resolve(), sys.argv[3:]
    os.set_inheritable(fd, False)           # the run's own subprocesses must not keep the pipe open
    sys.path[0] = str(script.parent)        # the script's own repository first, as `python SCRIPT` sets it
    from experiments.result_cache import ResultCache

    put_batch = ResultCache.put_batch
    held = []

    def put_batch_then_hold(self, rows, picks, scores):
        put_batch(self, rows, picks, scores)
        if not held:
            held.append(True)
            os.write(fd, f"holding after forward batch 1 (pid {os.getpid()})\n".encode())
            os.close(fd)
            time.sleep(HOLD_S)              # a signal's handler raising (SIGINT: KeyboardInterrupt) ends it here

    ResultCache.put_batch = put_batch_then_hold
    sys.argv = [sys.argv[2], *args]         # argv[0] as given (run.py's resume line repeats it)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
