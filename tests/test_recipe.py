"""Recipes: loading and validation, `synth --recipe` precedence (flag > recipe > default), [env]."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import omnitts.api
from omnitts.cli import app
from omnitts.recipe import KEYS, Recipe, RecipeError, apply_env, load_recipe

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
runner = CliRunner()


def _recipe(tmp_path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name,device", [("cpu", "cpu"), ("cuda-h100", "cuda"), ("ascend-910b", "npu")])
def test_shipped_recipes_load(name, device):
    recipe = load_recipe(RECIPES / f"{name}.toml")
    assert recipe.device == device and recipe.max_batch >= 1 and recipe.codec_chunk_frames > 0
    # recipes/README.md's table: max batch 16 on the CPU (dtype auto), 64 with bfloat16 graphs elsewhere;
    # no recipe sets codec_dtype, so the codec stays float32.
    assert recipe.max_batch == (16 if device == "cpu" else 64) and recipe.codec_dtype is None
    if device == "cpu":
        assert recipe.dtype == "auto" and recipe.env == {}
    else:
        assert recipe.graph_buckets == [1, 2, 4, 8, 16, 32, 64] and recipe.dtype == "bfloat16"
        # NPU graphs also need task queue level 1 (many Ascend guides export 2, under which capture fails).
        extra = {"TASK_QUEUE_ENABLE": "1"} if device == "npu" else {}
        assert recipe.env == {f"PYTORCH_{device.upper()}_ALLOC_CONF": "expandable_segments:True", **extra}


def test_unknown_key_names_file_key_and_valid_keys(tmp_path):
    path = _recipe(tmp_path, 'device = "cpu"\nmax_batchs = 4\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert str(err.value) == f"{path}: max_batchs: unknown key (did you mean 'max_batch'?); valid keys are {', '.join(KEYS)}"
    assert "max_batch" in KEYS and "env" in KEYS and "path" not in KEYS


@pytest.mark.parametrize("text,message", [
    ('max_batch = "8"', "max_batch: expected an integer, got a string"),
    ("max_batch = true", "max_batch: expected an integer, got a boolean"),
    ("max_batch = 0", "max_batch: must be > 0, got 0"),
    ("codec_chunk_frames = 0", "codec_chunk_frames: must be > 0, got 0"),
    ("codec_chunk_frames = 2.5", "codec_chunk_frames: expected an integer, got a number"),
    ('eager = "yes"', "eager: expected true or false, got a string"),
    ('device = "tpu"', "device: 'tpu' is not one of cpu, cuda, npu"),
    # torch's name of one device gets the hint `--device cuda:0` gets (it was "not one of cpu, cuda, npu")
    ('device = "cuda:0"', "device: 'cuda:0': give the kind, 'cuda'; to run on device 0: --devices cuda:0, or "
                          "CUDA_VISIBLE_DEVICES=0 before the command"),
    ('device = "NPU:3"', "device: 'npu:3': give the kind, 'npu'; to run on device 3: --devices npu:3, or "
                         "ASCEND_RT_VISIBLE_DEVICES=3 before the command"),
    ('dtype = "int8"', "dtype: 'int8' is not one of auto, float32, bfloat16, float16"),
    ('codec_dtype = "float16"', "codec_dtype: 'float16' is not one of float32, bfloat16"),
    ("graph_buckets = 8", "graph_buckets: expected a list, got an integer"),
    ("graph_buckets = [4, 2]", "graph_buckets: list each size once, in increasing order"),
    ("graph_buckets = [0, 2]", "graph_buckets: expected a list of batch sizes >= 1"),
    ("span_buckets = [512, 256]", "span_buckets: list each size once, in increasing order"),
    ("span_buckets = [0, 256]", "span_buckets: expected a list of position counts >= 1"),
    ("max_prefill_tokens = 0", "max_prefill_tokens: must be > 0, got 0"),
    ("env = 3", "env: expected a table, got an integer"),
    ("[env]\nX = 1", "env.X: expected a string, got an integer"),
    # what os.environ refuses (a traceback as the run started)
    ('[env]\n"" = "x"', "env: '' is not an environment variable's name (not empty, no '=' or NUL)"),
    ('[env]\n"A=B" = "x"', "env: 'A=B' is not an environment variable's name"),
    ('[env]\nX = "a\\u0000b"', "env.X: a NUL character cannot be in an environment variable"),
    ("max_batch = ", "not valid TOML"),
])
def test_bad_values_name_the_key(tmp_path, text, message):
    path = _recipe(tmp_path, text + "\n")
    with pytest.raises(RecipeError, match=f"^{path}: .*") as err:
        load_recipe(path)
    assert message in str(err.value)


def test_names_are_read_in_any_case_as_the_flags_read_them(ckpt_dir, tmp_path, recorded_load):
    """`dtype = "FLOAT32"` was refused ("'FLOAT32' is not one of ...") while `--dtype FLOAT32` was taken: each
    name a recipe sets is read as the flag reads it (any case, spaces around it dropped), and the engine gets
    exactly what the lower-case recipe gives; a name that is no choice is still refused, named as written."""
    upper = _recipe(tmp_path, 'device = "CPU"\ndtype = " Float32 "\ncodec_dtype = "BFLOAT16"\n')
    recipe = load_recipe(upper)
    assert (recipe.device, recipe.dtype, recipe.codec_dtype) == ("cpu", "float32", "bfloat16")
    _synth(ckpt_dir, tmp_path, "--recipe", str(upper))
    lower = tmp_path / "lower.toml"
    lower.write_text('device = "cpu"\ndtype = "float32"\ncodec_dtype = "bfloat16"\n')
    _synth(ckpt_dir, tmp_path, "--recipe", str(lower))
    picked = [{k: kwargs.get(k) for k in ("device", "dtype", "codec_dtype")} for kwargs, _ in recorded_load]
    assert picked == [dict(device="cpu", dtype="float32", codec_dtype="bfloat16")] * 2, picked
    for text, message in (('dtype = "Float64"', "dtype: 'Float64' is not one of auto, float32, bfloat16, float16"),
                          ('device = "TPU"', "device: 'TPU' is not one of cpu, cuda, npu"),
                          ('codec_dtype = "FLOAT16"', "codec_dtype: 'FLOAT16' is not one of float32, bfloat16")):
        path = _recipe(tmp_path, text + "\n")
        with pytest.raises(RecipeError) as err:
            load_recipe(path)
        assert str(err.value) == f"{path}: {message}", err.value


def test_missing_file(tmp_path):
    with pytest.raises(RecipeError, match="nope.toml: cannot read recipe"):
        load_recipe(tmp_path / "nope.toml")


def test_a_recipe_that_is_not_utf8_is_named_with_where(tmp_path):
    path = tmp_path / "r.toml"
    path.write_bytes(b'device = "cpu"\n# caf\xe9\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert str(err.value) == f"{path}: not UTF-8 text (byte 0xe9 at line 2, column 6; save the file as UTF-8)"


def test_a_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "r.toml"
    path.write_bytes("\ufeffmax_batch = 4\n".encode("utf-8"))
    assert load_recipe(path).max_batch == 4


def test_python_3_10_gets_a_toml_reader():
    """The README says Python 3.10+; tomllib is 3.11's, so on 3.10 load_recipe imports tomli, which the
    package must then depend on (without it every --recipe was a ModuleNotFoundError traceback on 3.10)."""
    import re
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert any(re.fullmatch(r"tomli>=[\d.]+\s*;\s*python_version\s*<\s*['\"]3\.11['\"]", dep)
               for dep in project["dependencies"]), project["dependencies"]


def test_apply_env_keeps_what_the_user_exported():
    recipe = Recipe(env={"A_ALLOC": "recipe", "B_ALLOC": "recipe"})
    environ = {"B_ALLOC": "mine"}
    assert apply_env(recipe, environ) == {"A_ALLOC": "recipe"}
    assert environ == {"A_ALLOC": "recipe", "B_ALLOC": "mine"}


@pytest.fixture
def recorded_load(monkeypatch):
    """Patch omnitts.api.load to record its keyword arguments and the environment it ran in."""
    calls = []
    real = omnitts.api.load

    def load(path, **kwargs):
        calls.append((kwargs, {k: os.environ.get(k) for k in ("OMNITTS_TEST_A", "OMNITTS_TEST_B")}))
        return real(path, **kwargs)

    monkeypatch.setattr(omnitts.api, "load", load)
    return calls


def _synth(ckpt_dir, tmp_path, *extra):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Hello.", "speaker": "ryan"}) + "\n")
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                 "--max-frames", "2", "-q", *extra])
    assert result.exit_code == 0, result.output
    return out


def test_flags_override_the_recipe_which_overrides_defaults(ckpt_dir, tmp_path, recorded_load):
    recipe = _recipe(tmp_path, 'device = "cpu"\nmax_batch = 2\neager = true\ngraph_buckets = [1, 2]\n'
                               'codec_dtype = "bfloat16"\n')
    _synth(ckpt_dir, tmp_path, "--recipe", str(recipe), "--max-batch", "3", "--no-eager", "--codec-dtype", "float32")
    _synth(ckpt_dir, tmp_path, "--recipe", str(recipe))
    _synth(ckpt_dir, tmp_path)
    _synth(ckpt_dir, tmp_path, "--max-batch", "5")
    names = ("device", "dtype", "codec_dtype", "max_batch", "eager", "graph_buckets")
    picked = [{k: kwargs.get(k) for k in names} for kwargs, _ in recorded_load]
    assert picked == [  # flags win, then the recipe, then the built-in defaults
        dict(device="cpu", dtype="auto", codec_dtype="float32", max_batch=3, eager=False, graph_buckets=[1, 2]),
        dict(device="cpu", dtype="auto", codec_dtype="bfloat16", max_batch=2, eager=True, graph_buckets=[1, 2]),
        dict(device="cpu", dtype="auto", codec_dtype="float32", max_batch=8, eager=False, graph_buckets=None),
        dict(device="cpu", dtype="auto", codec_dtype="float32", max_batch=5, eager=False, graph_buckets=None),
    ]


def test_recipe_env_is_set_before_load_without_clobbering(ckpt_dir, tmp_path, recorded_load, monkeypatch):
    monkeypatch.setenv("OMNITTS_TEST_A", "x")
    monkeypatch.delenv("OMNITTS_TEST_A")  # absent now; monkeypatch removes it again afterwards
    monkeypatch.setenv("OMNITTS_TEST_B", "exported by the user")
    recipe = _recipe(tmp_path, '[env]\nOMNITTS_TEST_A = "from recipe"\nOMNITTS_TEST_B = "from recipe"\n')
    _synth(ckpt_dir, tmp_path, "--recipe", str(recipe))
    assert recorded_load[0][1] == {"OMNITTS_TEST_A": "from recipe", "OMNITTS_TEST_B": "exported by the user"}


def test_bad_recipe_stops_the_command(ckpt_dir, tmp_path):
    recipe = _recipe(tmp_path, "max_batch = -1\n")
    result = runner.invoke(app, ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("custom_voice")),
                                 "-o", str(tmp_path / "o"), "--recipe", str(recipe)])
    assert result.exit_code == 2 and f"error: {recipe}: max_batch: must be > 0, got -1" in result.output


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_a_recipes_device_this_machine_lacks_is_named_as_the_recipes(ckpt_dir, tmp_path, monkeypatch, device):
    """`--recipe recipes/cuda-h100.toml` on a machine without CUDA said "error: --device cuda: ...", a flag never
    given; the error names the recipe's setting (a --device given wins, and is named as before)."""
    import torch

    import omnitts.device.npu
    from omnitts.errors import OmniTTSError

    def no_npu(given="--device npu"):  # as the real one: the flag (or recipe setting) the NPU was asked with
        raise OmniTTSError(f"{given} needs torch_npu (test)")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(omnitts.device.npu, "import_torch_npu", no_npu)
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    recipe = _recipe(tmp_path, f'device = "{device}"\n')
    args = ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"),
            "--recipe", str(recipe)]
    why = {"cuda": ": no CUDA device is visible to torch (use --device cpu)", "npu": " needs torch_npu (test)"}[device]
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output == f'error: {recipe}: device = "{device}"{why}\n', result.output
    flagged = runner.invoke(app, args + ["--device", device], env={"COLUMNS": "300"})
    assert flagged.exit_code == 2 and flagged.output == f"error: --device {device}{why}\n", flagged.output
