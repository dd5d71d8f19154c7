"""Teaching checks that ship with the system (requirements E, docs/requirements.md).

Each lesson is a small CPU computation through the project's own public functions
(the data stage's dedup weights, the training objectives, the learning-rate schedule,
the mixture plan, the ledger's confirmation rule) whose results are compared with the
numbers the seeds work out by hand. The expected numbers are stated once, in the lesson,
with the seed they come from; every computed number comes from the library, so a lesson
fails when the function it exercises misbehaves.

One module per lesson; ``checks`` the check framework, ``registry`` the lessons by name.
The heavy libraries (numpy, torch) are imported when a lesson runs, not when a
module loads: ``ledgerlm lessons --help`` lists the lessons without them.
"""
