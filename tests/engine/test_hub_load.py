"""load_model takes Hub IDs too: a split model's first shard fetches every shard,
through the real huggingface_hub client and a Hub-compatible test server."""

import os
import subprocess
import sys

from helpers import split_gguf
from hub_server import HubServer
from tiny_models import random_model, spec, write_gguf

CHILD = """
import sys
from gguf_serve.engine import load_model
lm = load_model(sys.argv[1], device="cpu")
print(len(lm.gguf.files), lm.architecture.name, len(lm.model.layers))
"""


def test_load_model_fetches_every_shard(tmp_path):
    s = spec("llama")
    whole = tmp_path / "tiny.gguf"
    write_gguf(s, random_model(s), whole, "Q8_0")
    shards = split_gguf(str(whole), str(tmp_path), "tiny", 3)
    with HubServer() as hub:
        hub.add_repo("org/split", {os.path.basename(p): p for p in shards})
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
               "HF_HUB_DISABLE_XET": "1"}
        p = subprocess.run([sys.executable, "-c", CHILD, "org/split:tiny-00001-of-00003.gguf"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-3:] == ["3", "llama", "2"]
    assert sum("tiny-0000" in q and "/resolve/" in q for q in hub.requests) >= 3
