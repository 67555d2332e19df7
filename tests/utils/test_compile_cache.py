"""rlax_core.utils.compile_cache: JAX's persistent compilation cache, configured once per process.

JAX's configuration is process-global and JAX decides at its first compilation whether to use a
cache, so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "RLAX_COMPILATION"))}
    environment.update({"PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", **(env or {})})
    prelude = textwrap.dedent("""
        import json, jax, jax.numpy as jnp
        from rlax_core.utils.compile_cache import enable_compilation_cache
        def state():
            return {"dir": jax.config.jax_compilation_cache_dir,
                    "min_s": jax.config.jax_persistent_cache_min_compile_time_secs}
    """)
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_configured_once_and_compiled_programs_land_in_the_folder(tmp_path):
    cache = tmp_path / "cache"
    out = _run(f"""
        first = enable_compilation_cache({str(cache)!r})
        second = enable_compilation_cache({str(cache)!r})
        jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
        print(json.dumps({{"first": first, "second": second, **state()}}))
    """)
    assert out["first"] == out["second"] == out["dir"] == str(cache)
    assert out["min_s"] == 0.0  # small programs are cached too
    assert any(cache.iterdir()), "the compiled program was not written to the cache folder"


def test_a_program_compiled_by_one_process_is_loaded_by_the_next(tmp_path):
    cache = tmp_path / "cache"
    code = f"""
        from jax import monitoring
        hits = []
        monitoring.register_event_listener(lambda event, **_: hits.append(event))
        enable_compilation_cache({str(cache)!r})
        jax.jit(lambda x: jnp.cos(x) @ x.T)(jnp.ones((5, 5))).block_until_ready()
        print(json.dumps({{"hit": "/jax/compilation_cache/cache_hits" in hits}}))
    """
    assert _run(code) == {"hit": False}
    assert _run(code) == {"hit": True}


def test_default_folder_is_the_users_cache_dir_or_the_environments(tmp_path):
    out = _run("print(json.dumps({'dir': enable_compilation_cache()}))", env={"XDG_CACHE_HOME": str(tmp_path)})
    assert out["dir"] == str(tmp_path / "rlax" / "jax")
    named = tmp_path / "named"
    out = _run("print(json.dumps({'dir': enable_compilation_cache()}))", env={"RLAX_COMPILATION_CACHE_DIR": str(named)})
    assert out["dir"] == str(named)


def test_a_users_own_jax_cache_setting_is_kept(tmp_path):
    own = tmp_path / "own"
    out = _run(f"""
        used = enable_compilation_cache({str(tmp_path / 'ours')!r})
        print(json.dumps({{"used": used, **state()}}))
    """, env={"JAX_COMPILATION_CACHE_DIR": str(own)})
    assert out["used"] == out["dir"] == str(own)
    assert out["min_s"] != 0.0  # the user's other cache settings are theirs too
    assert not (tmp_path / "ours").exists()


def test_disabled_leaves_jax_untouched(tmp_path):
    out = _run(f"""
        used = enable_compilation_cache({str(tmp_path / 'cache')!r}, enabled=False)
        print(json.dumps({{"used": used, **state()}}))
    """)
    assert out["used"] is None and out["dir"] is None
    assert not (tmp_path / "cache").exists()


def test_the_run_config_knob_reaches_the_rollout_workers_spec(tmp_path):
    from pipelines.config import find_config
    from pipelines.rl_stream import build_spec, load_configs

    run_config, loop = load_configs(str(find_config("quickstart")), [])
    assert run_config.run.compilation_cache and run_config.run.compilation_cache_dir == ""
    run_config, loop = load_configs(str(find_config("quickstart")), [
        "run.compilation_cache=false", f"run.compilation_cache_dir={tmp_path}"])
    spec = build_spec(run_config, train_set_size=1)
    assert (spec.compilation_cache, spec.compilation_cache_dir) == (False, str(tmp_path))


def test_the_filters_engine_handler_points_its_worker_at_the_spec_cache(tmp_path):
    """``rlax filter`` and ``rlax evaluate`` load their engine in RunInference's ``load_model``: that is
    where each worker process turns the cache on, or leaves JAX alone when the spec says so."""
    model, cache = REPO / "pipelines" / "assets" / "stories260K", tmp_path / "cache"
    out = _run(f"""
        from rlax_core.inference.config import EngineConfig, GenerationSpec
        from transforms.inference import EngineModelHandler
        def load(on):
            spec = GenerationSpec(model={str(model)!r}, compilation_cache=on, compilation_cache_dir={str(cache)!r},
                                  engine=EngineConfig(num_slots=2, num_pages=16, max_prompt_len=16, max_new_tokens=8))
            EngineModelHandler(spec).load_model()
            return state()["dir"]
        print(json.dumps({{"off": load(False), "on": load(True)}}))
    """)
    assert out == {"off": None, "on": str(cache)}
