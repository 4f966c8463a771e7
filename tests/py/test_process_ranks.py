"""Data-parallel ranks as processes on this host's CPU (train.data_parallel = "processes",
joined by sockets): every check of ranks_cases.py, so the launcher, the ranks' shared stop, a
dead rank's end, resume and rank 0's trace run in CI, where no GPU is."""
import unittest

import ranks_cases


class ProcessRanks(ranks_cases.RanksAsProcesses, unittest.TestCase):
    MODEL = ["backend=cpu", "train.threads=0", *ranks_cases.SMALL]
    TRANSPORT = "processes"


if __name__ == "__main__":
    unittest.main()
