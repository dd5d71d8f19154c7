"""The snapshot digest: the same for the same weights, different for any other, and on
a sharded model computed from the ranks' own shards, without gathering the model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from ledgerlm.model.gpt import GPT
from ledgerlm.train.evaluate import weights_digest
from train.digest_ranks import CFG, VOCAB

WORKER = Path(__file__).with_name("digest_ranks.py")


def test_a_sharded_digest_hashes_each_rank_s_shards_without_gathering_them(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--standalone", str(WORKER), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]  # every rank names the snapshot alike
    got = ranks[0]
    assert got["gathers"] == 0  # no whole tensor was gathered
    assert got["digest"] == got["again"] != got["other"]
    assert got["rank1_changed"] != got["digest"]  # rank 0's digest holds rank 1's shard
    # the digest depends on the sharding: one process hashes the same weights otherwise
    torch.manual_seed(0)
    assert weights_digest(GPT(CFG, VOCAB)) != got["digest"]
