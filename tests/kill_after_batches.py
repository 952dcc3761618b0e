"""`python tests/kill_after_batches.py K SCRIPT ARGS...`: run SCRIPT (run.py) as `python SCRIPT ARGS...` would, in
this process, and kill the process with SIGKILL right after the K-th forward batch is committed to the result cache.

The real ResultCache.put_batch runs and commits first; the kill follows it, as a crash between two batches would. A
run that never commits K batches is not killed and exits as it would have, so a test that expects the kill fails.
Under torchrun each rank runs this file and counts its own batches."""
import os
import runpy
import signal
import sys
from pathlib import Path


def main():
    after, script, args = int(sys.argv[1]), Path(sys.argv[2]).resolve(), sys.argv[3:]
    sys.path[0] = str(script.parent)        # the script's own repository first, as `python SCRIPT` sets it
    from experiments.result_cache import ResultCache

    put_batch = ResultCache.put_batch
    committed = []

    def put_batch_then_die(self, rows, picks, scores):
        put_batch(self, rows, picks, scores)
        committed.append(len(rows))
        if len(committed) == after:
            os.kill(os.getpid(), signal.SIGKILL)

    ResultCache.put_batch = put_batch_then_die
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
