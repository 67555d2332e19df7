"""The quickstart's ``final_model/`` is written by the trainer's exporter: ``rlax generate --model`` reads it."""

import json
from pathlib import Path

from pipelines.cli import main
from pipelines.config import find_config, load_run_config
from pipelines.quickstart import QUICKSTART_RECIPE, export_final_model
from rlax_core.models import from_pretrained

STORIES = Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K"


def test_the_final_model_folder_is_complete_and_generates_like_the_policy(tmp_path, capsys):
    policy = from_pretrained(STORIES)
    run_config = load_run_config(str(find_config(QUICKSTART_RECIPE)), ["loop.sampling.stop_token_ids=[13, 1, 2]"])
    export_final_model(run_config, policy.config, policy.params, tmp_path / "final_model")
    names = {p.name for p in (tmp_path / "final_model").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.model", "tokenizer_config.json",
            "generation_config.json"} <= names
    assert json.loads((tmp_path / "final_model" / "generation_config.json").read_text())["eos_token_id"] == [2, 1, 13]

    # The README's command on the folder: the weights are the policy's (tests/models/test_export.py
    # checks that bit for bit), so the greedy story goes on as stories260K's does.
    assert main(["generate", "--model", str(tmp_path / "final_model"), "--prompt", "Once upon a time",
                 "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out.startswith(", there was a little")
