"""The sub-commands beside serve refuse a wrong argument or input file with one line naming it,
before any work: each of these was a traceback, a hang (--rate inf) or a run that sent nothing."""

from __future__ import annotations

import pytest

from gateway.cli import main
from tests.helpers import EXAMPLES

ZOO = "{zoo}"  # a zoo CSV written by the test


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    said = str(stopped.value.code) if isinstance(stopped.value.code, str) else capsys.readouterr().err
    assert stopped.value.code != 0 and "Traceback" not in said
    return said


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["simulate", "--zoo", "/nonexistent.csv", "--rate", "10"], "argument --zoo: no file at /nonexistent.csv"),
        (["simulate", "--zoo", ZOO, "--rate", "100", "--shape", "0"], "argument --shape: '0' must be a finite number over 0"),
        (["simulate", "--zoo", ZOO, "--rate", "-5"], "argument --rate: '-5' must be a finite number over 0"),
        (["simulate", "--zoo", ZOO, "--rate", "10", "--gpus", "-2"], "argument --gpus: '-2' must be at least 1"),
        (["simulate", "--zoo", ZOO, "--rate", "10", "--output", "/no/such/folder/out.json"], "no folder /no/such/folder"),
        (["plan", str(EXAMPLES / "ocr.toml"), "--rate", "8", "--sample", "/nonexistent.png"], "argument --sample: no file at"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "inf"], "argument --rate: 'inf' must be a finite number"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--steps", "bad"], "argument --steps: 'bad' is not RATE:SECONDS"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0"], "argument --concurrency: '0' must be at least 1"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--shape", "x"], "argument --shape: 'x' is not NAME=D1"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--duration", "0"], "argument --duration: '0' must be"),
        (
            ["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--output", "run.png"],
            "argument --output: 'run.png' is the report's name: give the JSON's (run.json), the report goes beside it",
        ),
        # Each of these was a traceback, a hang or a run that did something else than asked.
        (["simulate", "--zoo", ZOO, "--goodput", "--shapes", "nan"], "--shapes 'nan': expected finite numbers of at least 0.01"),
        (["simulate", "--zoo", ZOO, "--goodput", "--shapes", "0.3,-1"], "--shapes '0.3,-1': expected finite numbers"),
        (["simulate", "--zoo", ZOO, "--goodput", "--tolerance", "1e-300"], "argument --tolerance: '1e-300' must be from 0.0001"),
        (["simulate", "--zoo", ZOO, "--rate", "10", "--dispatch-delay-ms", "inf"], "argument --dispatch-delay-ms: 'inf' must"),
        (["simulate", "--zoo", ZOO, "--rate", "10", "--dispatch-delay-ms", "-1"], "'-1' must be a finite number of at least 0"),
        (["simulate", "--zoo", ZOO, "--rate", "10", "--seed", "-1"], "argument --seed: '-1' must be at least 0"),
        # Gaps of a Gamma shape so small all round to 0: the run never ended.
        (["simulate", "--zoo", ZOO, "--rate", "10", "--shape", "1e-300"], "argument --shape: '1e-300' is under 0.01"),
        (["simulate", "--zoo", ZOO, "--goodput", "--shapes", "0.3,1e-300"], "expected finite numbers of at least 0.01"),
        # Every arrival drawn before the run: these took the machine's memory.
        (["simulate", "--zoo", ZOO, "--rate", "1e300", "--duration", "1"], "ask for 1e+300 arrivals, more than the 5,000,000"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1e9"], "ask for 1e+10 arrivals, more than the 5,000,000"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--steps", "1:1,1e7:1"], "ask for 1e+07 arrivals"),
        (["identify", "http://127.0.0.1:9", "--model", "m", "--rate", "1e9"], "gateway identify: the rates and seconds ask for"),
        # Found out after the run, the results were lost with the report.
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--output", "{folder}/run.json"], "run.png is a folder"),
        (["simulate", "--zoo", ZOO, "--rate", "10", "--output", "{folder}"], "is a folder; give a file's name"),
        (["simulate", "--zoo", ZOO, "--rate", "10", "--output", "/proc/x.json"], "/proc/x.json cannot be written"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--seed", "-1"], "argument --seed: '-1' must be"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--timeout-ms", "1e300"], "must be from 0.001"),
        (["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--output", "/proc/x.json"], "cannot be written"),
        (["identify", "http://127.0.0.1:9", "--model", "m", "--rate", "10", "--seconds", "nan"], "argument --seconds: 'nan'"),
        (["identify", "http://127.0.0.1:9", "--model", "m", "--rate", "0"], "argument --rate: '0' must be a finite number"),
        (["identify", "http://127.0.0.1:9", "--model", "m", "--rate", "10", "--cores", "1"], "'1' is not LOW,HIGH"),
        (["identify", "http://127.0.0.1:9", "--model", "m", "--rate", "10", "--cores", "1,0.5"], "the second larger"),
        (["identify", "http://127.0.0.1:9", "--model", "m", "--rate", "10", "--cores", "abc"], "'abc' is not a number"),
        (["identify", "http://127.0.0.1:9", "--model", "m", "--rate", "10", "--seconds", "1"], "Cannot connect to host"),
        (["plan", str(EXAMPLES / "ocr.toml"), "--rate", "8", "--profiles", "x", "--cores", "abc"], "'abc' is not a number"),
        (["plan", str(EXAMPLES / "ocr.toml"), "--rate", "8", "--profiles", "x", "--cores", "0"], "'0' must be a finite number"),
        (["plan", str(EXAMPLES / "ocr.toml"), "--rate", "8", "--profiles", "x", "--gpu-price", "-5"], "at least 0"),
        (["plan", str(EXAMPLES / "ocr.toml"), "--rate", "8", "--profiles", "x", "--functions-ms", "-9"], "at least 0"),
        (["plan", str(EXAMPLES / "ocr.toml"), "--rate", "8", "--profiles", "http://127.0.0.1:9"], "Connection refused"),
        (["plan", str(EXAMPLES / "ocr.toml"), "--rate", "8", "--profiles", "nowhere"], "unknown url type"),
    ],
)
def test_a_wrong_argument_is_one_line_naming_it(argv, words, capsys, tmp_path):
    zoo = tmp_path / "zoo.csv"
    zoo.write_text("model,alpha_ms,beta_ms,slo_ms\nm,1,2,50\n")
    (tmp_path / "run.png").mkdir()
    assert words in _refused([word.format(zoo=zoo, folder=tmp_path) for word in argv], capsys)


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        # alpha 0 passed, then the goodput's upper bound divided by it.
        ("m,0,2,50\n", "row 'm' needs model and alpha_ms, beta_ms, slo_ms: finite numbers, alpha and the SLO over 0"),
        # Merged into one model: half its load was dropped and the goodput reported twice what was served.
        ("m,1,2,50\nm,1,2,50\n", "model 'm' is listed twice"),
    ],
)
def test_a_zoo_that_would_mislead_is_refused(rows, words, tmp_path, capsys):
    zoo = tmp_path / "zoo.csv"
    zoo.write_text("model,alpha_ms,beta_ms,slo_ms\n" + rows)
    assert words in _refused(["simulate", "--zoo", str(zoo), "--rate", "10"], capsys)
    zoo.write_bytes(b"model,alpha_ms,beta_ms,slo_ms\n\xff\xfe,1,2,50\n")
    assert "is not a CSV file of text" in _refused(["simulate", "--zoo", str(zoo), "--rate", "10"], capsys)


def test_cpu_profiles_that_are_no_times_or_of_no_model_are_refused(tmp_path, tmp_models, capsys):
    """nan gave a traceback; -5,-5 counted every request in SLO, served in negative time; a name
    of no model was ignored."""
    (tmp_models / "good.toml").write_text("[models.m]\npath = 'mlp.onnx'\nsla_ms = 50\n")
    (tmp_path / "arrivals.json").write_text('[[0.1, "m"]]')
    argv = ["simulate", "--config", str(tmp_models / "good.toml"), "--arrivals", str(tmp_path / "arrivals.json")]
    for profile in ("m=nan,1", "m=-5,-5", "m=0,0"):
        assert "finite numbers of at least 0, not both 0" in _refused([*argv, "--cpu-profile", profile], capsys)
    assert "--cpu-profile other: not a model of" in _refused([*argv, "--cpu-profile", "other=0.5,1"], capsys)
    # None for a model with a CPU executor: it was left out, and every request timed out.
    assert "no --cpu-profile for m: a model with a CPU executor needs its l(b)" in _refused(argv, capsys)


def test_wrong_inputs_are_named(tmp_path, tmp_models, capsys):
    short = tmp_path / "zoo.csv"
    short.write_text("model,alpha_ms,beta_ms\nm,1,2\n")
    said = _refused(["simulate", "--zoo", str(short), "--rate", "10"], capsys)
    assert "row 'm' needs model and alpha_ms, beta_ms, slo_ms" in said
    (tmp_models / "bad.toml").write_text("[models.m]\npath = 'mlp.onnx'\nsla_ms = '50'\n")
    (tmp_path / "arrivals.json").write_text('[[0.1, "nope"]]')
    said = _refused(["simulate", "--config", str(tmp_models / "bad.toml"), "--arrivals", str(tmp_path / "arrivals.json")], capsys)
    assert "config error" in said and "models.m.sla_ms: must be a number" in said
    (tmp_models / "good.toml").write_text("[models.m]\npath = 'mlp.onnx'\nsla_ms = 50\n")
    arrivals = str(tmp_path / "arrivals.json")
    said = _refused(["simulate", "--config", str(tmp_models / "good.toml"), "--arrivals", arrivals], capsys)
    assert "the arrivals name 'nope', not a model of" in said
    said = _refused(["bench", "http://127.0.0.1:9", "--model", "m", "--rate", "10", "--duration", "1", "--quiet"], capsys)
    assert "gateway bench: cannot reach http://127.0.0.1:9" in said


@pytest.mark.parametrize(
    ("arrivals", "words"),
    [
        ("[]", "the arrivals: none given: nothing to simulate"),
        ('[[0.1, "m"], [NaN, "m"]]', "the arrivals: nan (model 'm') is no time: each must be a finite number of seconds from 0"),
        ('[[-1, "m"]]', "the arrivals: -1.0 (model 'm') is no time"),
        ('[[Infinity, "m"]]', "the arrivals: inf (model 'm') is no time"),
    ],
)
def test_arrivals_that_are_no_times_are_named(arrivals, words, tmp_path, tmp_models, capsys):
    """None at all divided by a span of 0, and a NaN time, which never compares, kept the clock from ever passing it."""
    (tmp_models / "good.toml").write_text("[models.m]\npath = 'mlp.onnx'\nsla_ms = 50\n")
    (tmp_path / "arrivals.json").write_text(arrivals)
    argv = ["simulate", "--config", str(tmp_models / "good.toml"), "--arrivals", str(tmp_path / "arrivals.json")]
    said = _refused([*argv, "--cpu-profile", "m=0.5,1"], capsys)
    assert f"gateway simulate: {words}" in said


def test_arrivals_nested_past_the_parsers_depth_are_no_arrivals(tmp_path, tmp_models, capsys):
    """Their RecursionError was a traceback."""
    (tmp_models / "good.toml").write_text("[models.m]\npath = 'mlp.onnx'\nsla_ms = 50\n")
    (tmp_path / "arrivals.json").write_text("[" * 100_000 + "]" * 100_000)
    argv = ["simulate", "--config", str(tmp_models / "good.toml"), "--arrivals", str(tmp_path / "arrivals.json")]
    assert "arrivals.json is not JSON [[seconds, model], ...]" in _refused([*argv, "--cpu-profile", "m=0.5,1"], capsys)


def test_simulate_options_that_the_chosen_mode_does_not_read_are_refused(tmp_path, tmp_models, capsys):
    """--gpus with --config was ignored silently (the config's node.gpus decide), as --shapes with --rate."""
    zoo = tmp_path / "zoo.csv"
    zoo.write_text("model,alpha_ms,beta_ms,slo_ms\nm,1,2,50\n")
    (tmp_models / "good.toml").write_text("[models.m]\npath = 'mlp.onnx'\nsla_ms = 50\n")
    (tmp_path / "arrivals.json").write_text('[[0.1, "m"]]')
    config = ["simulate", "--config", str(tmp_models / "good.toml"), "--arrivals", str(tmp_path / "arrivals.json")]
    said = _refused([*config, "--cpu-profile", "m=0.5,1", "--gpus", "4", "--duration", "3"], capsys)
    assert "--duration, --gpus: not read by --config" in said
    said = _refused(["simulate", "--zoo", str(zoo), "--rate", "10", "--shapes", "0.3", "--arrivals", str(zoo)], capsys)
    assert "--arrivals, --shapes: not read by --zoo --rate" in said
    said = _refused(["simulate", "--zoo", str(zoo), "--goodput", "--rate", "10", "--cpu-profile", "m=1,1"], capsys)
    assert "--cpu-profile, --rate: not read by --zoo --goodput" in said
