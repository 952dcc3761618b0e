"""Write a synthetic MC-TACO split in the authors' exact file format, with the real split's shape, for timing.

    python synth_mctaco.py --split validation --out synth_dev_3783.tsv   # 3,783 rows, 561 questions
    python synth_mctaco.py --split test --out synth_test_9442.tsv        # 9,442 rows, 1,332 questions

The real authors' files (CogComp/MCTACO dataset/dev_3783.tsv, test_9442.tsv) are not in this repository. To
measure how long a whole split takes with both paths, this script composes a file of the same shape: the same
row count, question count and yes/no label counts as the pinned facts in resources.lock.json (mc-taco,
mc-taco-test), all five temporal categories, 6-8 candidates per question, sentences of about 20-30 words. Every
text is composed here from small word lists; none is taken from MC-TACO. The output is deterministic (a
random.Random seeded with a fixed string): the same --split always gives the same bytes, and the script prints
the file's canonical content sha256 so two machines can check they time the same data.

It is NOT MC-TACO: its scores mean nothing, only its timings do (the prompt lengths are of the same order as the
real data's, not equal to them). Import it under a name of your own, then run the experiment on it:

    python prepare.py --cache ./cache --data-file synth_dev_3783.tsv --name synth-mctaco-dev
    python prepare.py --cache ./cache --data-file synth_test_9442.tsv --name synth-mctaco-test --as-split test
    python run.py --cache ./cache --out t-dev --experiment mctaco --data synth-mctaco-dev --no-cache

(run.py's O/mctaco/stages.json has the seconds per stage: official, official_limit_runs, independent.)
"""
import argparse
import random
import sys

import resources

# The shape of the real splits (the pinned facts of resources.lock.json's mc-taco and mc-taco-test entries).
SHAPES = {"validation": {"rows": 3783, "questions": 561, "yes": 1229},
          "test": {"rows": 9442, "questions": 1332, "yes": 3198}}

SUBJECTS = ["the harbour master", "a retired teacher", "the village baker", "my older cousin", "the night nurse",
            "a young architect", "the football coach", "two exchange students", "the museum guard", "a beekeeper",
            "the town librarian", "an amateur astronomer", "the ferry captain", "her grandfather", "the new mayor",
            "a street musician", "the postwoman", "our chemistry teacher", "the lighthouse keeper", "a wine grower"]
ACTIONS = [("repaired the old stone bridge", "repair the old stone bridge"),
           ("planted a row of cherry trees", "plant a row of cherry trees"),
           ("wrote a long letter to the regional newspaper", "write a long letter to the regional newspaper"),
           ("painted the walls of the community hall", "paint the walls of the community hall"),
           ("organised a small concert for the hospital", "organise a small concert for the hospital"),
           ("rebuilt the fence around the school garden", "rebuild the fence around the school garden"),
           ("cleaned the windows of the railway station", "clean the windows of the railway station"),
           ("baked bread for the whole street", "bake bread for the whole street"),
           ("counted the birds on the northern marsh", "count the birds on the northern marsh"),
           ("sorted the donated books in the basement", "sort the donated books in the basement"),
           ("tuned the piano in the chapel", "tune the piano in the chapel"),
           ("cleared the snow from the mountain road", "clear the snow from the mountain road")]
WHENS = ["after the spring floods had passed", "before the harvest festival began", "during the long dry summer",
         "while most of the town was still asleep", "soon after the new road was opened",
         "on the first cold weekend of the autumn", "in the weeks before the elections",
         "when the old factory finally closed"]
TAILS = ["and several neighbours stopped to watch", "although the weather was far from kind",
         "because nobody else had offered to help", "and the local radio later reported on it",
         "with help from a few patient friends", "even though the budget was very small"]

# Per category: the question (from the subject and the action's base form), plausible and implausible answers.
CATEGORIES = {
    "Event Duration": ("How long did it take {subj} to {base}?",
                       ["about three hours", "most of the afternoon", "two days", "a few weeks", "several hours",
                        "one long morning"],
                       ["four seconds", "ninety years", "half a millisecond", "two centuries", "a blink of an eye",
                        "six hundred years", "a tenth of a second", "forty decades"]),
    "Event Ordering": ("What did {subj} do after they {past}?",
                       ["went home to rest", "cleaned and stored the tools", "thanked the people who helped",
                        "had a quiet dinner", "told their family about it", "took a few photographs"],
                       ["was born", "learned to walk for the first time", "started the very same job",
                        "planned the work for the first time", "had never heard of the town", "moved there as a baby",
                        "went to primary school", "bought the materials before starting"]),
    "Frequency": ("How often does {subj} {base}?",
                  ["once a year", "every few months", "twice a season", "every spring", "now and then",
                   "about once a decade"],
                  ["every second", "ten times a minute", "three hundred times a day", "every few heartbeats",
                   "once a millennium", "twice an hour without a break", "every single minute", "never at all"]),
    "Typical Time": ("At what time of day did {subj} {base}?",
                     ["in the morning", "at nine in the morning", "early in the afternoon", "around noon",
                      "just after breakfast", "late in the morning"],
                     ["at three in the morning", "at midnight", "in the middle of the night", "at 2:00 AM",
                      "an hour before dawn", "at four in the morning", "at 1:30 AM", "shortly after midnight"]),
    "Stationarity": ("Did {subj} still care about the town a year later?",
                     ["yes, very much", "yes", "certainly", "most likely yes", "yes, for many years",
                      "probably"],
                     ["no, only for a minute", "no, it stopped at once", "only for one second",
                      "no, they forgot it that evening", "no, not after lunch", "only for the first hour",
                      "no, never again after a day", "for half a minute only"]),
}


def plan_counts(n, total):
    """`total` split over n items as evenly as possible: the first total % n get one more."""
    return [total // n + (i < total % n) for i in range(n)]


def sentence_for(rng):
    subj = rng.choice(SUBJECTS)
    past, base = rng.choice(ACTIONS)
    text = f"{subj[0].upper()}{subj[1:]} {past} {rng.choice(WHENS)}, {rng.choice(TAILS)}."
    return text, subj, past, base


def question_rows(rng, category, n_rows, n_yes, seen):
    """The rows of one question: a new (sentence, question) pair, n_yes plausible and n_rows - n_yes implausible
    answers, in an order drawn from rng."""
    template, yes_pool, no_pool = CATEGORIES[category]
    while True:
        sentence, subj, past, base = sentence_for(rng)
        question = template.format(subj=subj, past=past, base=base)
        question = question[0].upper() + question[1:]
        if (sentence, question) not in seen:
            seen.add((sentence, question))
            break
    answers = [(a, "yes") for a in rng.sample(yes_pool, n_yes)] + \
              [(a, "no") for a in rng.sample(no_pool, n_rows - n_yes)]
    rng.shuffle(answers)
    return [(sentence, question, a, label, category) for a, label in answers]


def synthetic_lines(split):
    """The file's lines for `split`, deterministic."""
    shape = SHAPES[split]
    rng = random.Random(f"mctaco-synthetic-{split}-v1")
    n_q = shape["questions"]
    rows_per_q = plan_counts(n_q, shape["rows"])
    yes_per_q = plan_counts(n_q, shape["yes"])
    rng.shuffle(rows_per_q)
    rng.shuffle(yes_per_q)
    categories = list(CATEGORIES)
    seen, lines = set(), []
    for i in range(n_q):
        n_yes = min(yes_per_q[i], rows_per_q[i] - 1)
        for fields in question_rows(rng, categories[i % len(categories)], rows_per_q[i], n_yes, seen):
            lines.append("\t".join(fields) + "\n")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=sorted(SHAPES), required=True, help="the real split whose shape to copy")
    ap.add_argument("--out", required=True, help="the .tsv to write (atomically)")
    args = ap.parse_args(argv)
    text = "".join(synthetic_lines(args.split))
    resources.atomic_write_text(args.out, text)
    rows = resources.read_mctaco_tsv(args.out)  # the import path's own reader: the file is in the authors' format
    facts = resources.content_facts(rows, resources.MCTACO)
    shape = SHAPES[args.split]
    got = {"rows": facts["rows"], "questions": facts["n_questions"], "yes": facts["label_counts"]["yes"]}
    if got != shape:
        resources.fail(f"{args.out}: expected shape {shape}, wrote {got}", code=1)
    print(f"wrote {args.out}: {facts['rows']} rows, {facts['n_questions']} questions, labels {facts['label_counts']},"
          f" canonical content sha256 {facts['content_sha256']} (synthetic, NOT MC-TACO: for timing only)")


if __name__ == "__main__":
    sys.exit(main())
