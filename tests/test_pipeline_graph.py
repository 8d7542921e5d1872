"""A pipeline's DAG, pure: its checks name the step and tensor at fault; its order, waves and paths."""

from __future__ import annotations

import json

import pytest
from onnx import TensorProto, helper
from pydantic import TypeAdapter

from gateway.config import ConfigError, load_config
from gateway.config.schema import PipelineTable
from gateway.pipeline.graph import PipelineError, PipelineGraph
from gateway.server import ensemble_steps
from tests.helpers import save_model

MODELS = {"det": ["prob"], "cls": ["angle"], "rec": ["chars"], "emb": ["vector"]}


def table(steps: list[dict], outputs: list[dict] | None = None, paths: list[dict] | None = None) -> PipelineTable:
    raw = {
        "sla_ms": 100,
        "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}],
        "outputs": outputs or [{"name": "out", "datatype": "FP32", "shape": [-1], "source": f"{steps[-1]['name']}/chars"}],
        "steps": steps,
        "paths": paths or [],
    }
    return TypeAdapter(PipelineTable).validate_json(json.dumps(raw), strict=True)  # as the loader reads TOML


def model_step(name: str, model: str, source: str) -> dict:
    return {"name": name, "model": model, "inputs": {"x": source}}


CHAIN = [
    {"name": "prep", "function": "f.py:prep", "inputs": {"image": "request/image"}, "outputs": ["x"]},
    {"name": "a", "model": "det", "inputs": {"x": "prep/x"}},
    {"name": "b", "model": "cls", "inputs": {"x": "a/prob"}},
    {"name": "c", "model": "rec", "inputs": {"x": "b/angle", "y": "a/prob"}},
]


def test_a_chain_is_ordered_and_waved_by_what_each_step_reads():
    graph = PipelineGraph.build("p", table(CHAIN), MODELS)
    assert graph.order == ("prep", "a", "b", "c")
    assert graph.levels() == [["prep"], ["a"], ["b"], ["c"]]
    assert graph.needs["c"] == {"a", "b"}
    # Two paths end at c: through b, and straight from a; both carry the pipeline's SLA.
    assert graph.paths() == [(("prep", "a", "b", "c"), 100), (("prep", "a", "c"), 100)]


def test_independent_steps_share_a_wave_and_paths_carry_their_own_slas():
    steps = [
        {"name": "prep", "function": "f.py:prep", "inputs": {"image": "request/image"}, "outputs": ["x"]},
        {"name": "text", "model": "rec", "inputs": {"x": "prep/x"}},
        {"name": "vector", "model": "emb", "inputs": {"x": "prep/x"}},
    ]
    outputs = [
        {"name": "t", "datatype": "FP32", "shape": [-1], "source": "text/chars"},
        {"name": "v", "datatype": "FP32", "shape": [-1], "source": "vector/vector"},
    ]
    graph = PipelineGraph.build("p", table(steps, outputs, [{"steps": ["prep", "vector"], "sla_ms": 40}]), MODELS)
    assert graph.levels() == [["prep"], ["text", "vector"]]
    assert graph.paths() == [(("prep", "text"), 100), (("prep", "vector"), 40)]


@pytest.mark.parametrize(
    "steps, words",
    [
        ([*CHAIN, CHAIN[1]], "step 'a' is defined twice"),
        ([model_step("a", "nope", "request/image")], "no model 'nope'"),
        ([model_step("a", "det", "request/photo")], "no input 'photo'"),
        ([model_step("a", "det", "b/prob")], "no step 'b'"),
        ([model_step("a", "det", "request/image"), model_step("b", "rec", "a/oops")], "step 'a' gives no 'oops'"),
        ([model_step("a", "det", "b/chars"), model_step("b", "rec", "a/prob")], "in a cycle"),
        ([{"name": "a", "function": "f.py:g", "inputs": {"x": "request/image"}}], "must list its outputs"),
        ([{**model_step("a", "det", "request/image"), "function": "f.py:g"}], "exactly one of model and function"),
        ([model_step("request", "det", "request/image")], "names the pipeline's inputs"),
    ],
)  # fmt: skip
def test_each_mistake_names_its_step_and_tensor(steps, words):
    outputs = [{"name": "out", "datatype": "FP32", "shape": [-1], "source": f"{steps[0]['name']}/prob"}]
    with pytest.raises(PipelineError, match=words):
        PipelineGraph.build("p", table(steps, outputs), MODELS)


def test_a_path_must_follow_the_edges():
    with pytest.raises(PipelineError, match="'b' does not read from 'prep'"):
        PipelineGraph.build("p", table(CHAIN, paths=[{"steps": ["prep", "b"], "sla_ms": 10}]), MODELS)


def test_the_config_loader_checks_a_pipeline_against_its_models_and_functions(tmp_models):
    (tmp_models / "steps.py").write_text("def twice(inputs):\n    return {'x': inputs['x'] * 2}\n")
    head = "[models.mlp]\npath = 'mlp.onnx'\nsla_ms = 50\n[pipelines.p]\nsla_ms = 100\n"
    head += "inputs = [{ name = 'x', datatype = 'FP32', shape = [-1, 512] }]\n"
    good = head + (
        "outputs = [{ name = 'y', datatype = 'FP32', shape = [-1, 512], source = 'm/y' }]\n"
        "steps = [{ name = 'd', function = 'steps.py:twice', inputs = { x = 'request/x' }, outputs = ['x'] },\n"
        "         { name = 'm', model = 'mlp', inputs = { x = 'd/x' } }]\n"
    )
    path = tmp_models / "config.toml"
    path.write_text(good)
    assert list(load_config(path).pipelines) == ["p"]
    path.write_text(good.replace("source = 'm/y'", "source = 'm/z'"))
    with pytest.raises(ConfigError, match="pipelines.p: output 'y': step 'm' gives no 'z' \\(it gives: y\\)"):
        load_config(path)
    path.write_text(good.replace("steps.py:twice", "steps.py:thrice"))
    with pytest.raises(ConfigError, match=r"pipelines.p.steps\[0\].function: .*has no function 'thrice'"):
        load_config(path)
    path.write_text(good.replace("[pipelines.p]", "[pipelines.mlp]"))
    with pytest.raises(ConfigError, match="a model's name too"):
        load_config(path)
    # A model step fed by a name the model does not have: served, every request was a 500.
    path.write_text(good.replace("inputs = { x = 'd/x' }", "inputs = { X = 'd/x' }"))
    with pytest.raises(ConfigError, match=r"pipelines.p.steps\[1\].inputs: model 'mlp' has no input 'X' \(its inputs: x\)"):
        load_config(path)
    # Two outputs of one name: the answer carried the later one's tensor under both.
    twice = "outputs = [{ name = 'y', datatype = 'FP32', shape = [-1, 512], source = 'm/y' }, " + (
        "{ name = 'y', datatype = 'FP32', shape = [-1, 512], source = 'd/x' }]\n"
    )
    path.write_text(good.replace("outputs = [{ name = 'y', datatype = 'FP32', shape = [-1, 512], source = 'm/y' }]\n", twice))
    with pytest.raises(ConfigError, match="pipelines.p.outputs: 'y' named more than once"):
        load_config(path)
    # A step's file that exits as it is imported: serve exited with its status and said nothing.
    (tmp_models / "exits.py").write_text("raise SystemExit(5)\n")
    path.write_text(good.replace("steps.py:twice", "exits.py:twice"))
    with pytest.raises(ConfigError, match=r"pipelines.p.steps\[0\].function: .*exits.py failed to load: SystemExit: 5"):
        load_config(path)


def test_a_model_input_a_step_leaves_unfed_is_a_config_error(tmp_path):
    """A step feeding one of a two-input model's inputs was served, and every request was a 500
    ("the model's input 'b' is fed nothing")."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "two",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", 4])],
    )
    save_model(graph, tmp_path / "two.onnx")
    config = (
        "[models.two]\npath = 'two.onnx'\nsla_ms = 50\n[pipelines.p]\nsla_ms = 100\n"
        "inputs = [{ name = 'x', datatype = 'FP32', shape = [-1, 4] }]\n"
        "outputs = [{ name = 'y', datatype = 'FP32', shape = [-1, 4], source = 'm/c' }]\n"
        "steps = [{ name = 'm', model = 'two', inputs = { a = 'request/x' } }]\n"
    )
    (tmp_path / "config.toml").write_text(config)
    with pytest.raises(
        ConfigError, match=r"pipelines.p.steps\[0\].inputs: model 'two''s input 'b' is fed nothing \(its inputs: a, b\)"
    ):
        load_config(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text(config.replace("{ a = 'request/x' }", "{ a = 'request/x', b = 'request/x' }"))
    assert list(load_config(tmp_path / "config.toml").pipelines) == ["p"]


def test_edges_whose_types_can_never_agree_are_config_errors(tmp_models):
    """A BYTES input wired into a model's FP32 input, a shape of another rank or another fixed
    dimension, a model's FP32 output declared BYTES, a dimension under -1: each was served, and
    every request was a 500 (or, for the shape, a 400 the client could do nothing about)."""
    head = "[models.mlp]\npath = 'mlp.onnx'\nsla_ms = 50\n[pipelines.p]\nsla_ms = 100\n"
    good = head + (
        "inputs = [{ name = 'x', datatype = 'FP32', shape = [-1, 512] }]\n"
        "outputs = [{ name = 'y', datatype = 'FP32', shape = [-1, 512], source = 'm/y' }]\n"
        "steps = [{ name = 'm', model = 'mlp', inputs = { x = 'request/x' } }]\n"
    )
    path = tmp_models / "config.toml"
    path.write_text(good)
    assert list(load_config(path).pipelines) == ["p"]
    # Floats into floats are converted per request, as integers into integers are: not refused.
    path.write_text(
        good.replace("datatype = 'FP32', shape = [-1, 512] }]\noutputs", "datatype = 'FP64', shape = [-1, 512] }]\noutputs")
    )
    assert list(load_config(path).pipelines) == ["p"]
    mistakes = [
        (
            "datatype = 'FP32', shape = [-1, 512] }]\noutputs",
            "datatype = 'BYTES', shape = [-1, 512] }]\noutputs",
            r"pipelines.p.steps\[0\].inputs: 'request/x' into model 'mlp''s input 'x': BYTES where FP32 is wanted",
        ),
        (
            "shape = [-1, 512] }]\noutputs",
            "shape = [-1, 256] }]\noutputs",
            r"'request/x' into model 'mlp''s input 'x': shape \[-1, 256\] where \[-1, 512\] is wanted",
        ),
        (
            "shape = [-1, 512] }]\noutputs",
            "shape = [512] }]\noutputs",
            r"shape \[512\] where 2 dimensions \[-1, 512\] are wanted",
        ),
        (
            "name = 'y', datatype = 'FP32'",
            "name = 'y', datatype = 'BYTES'",
            r"pipelines.p.outputs\[0\]: 'm/y' as output 'y': FP32 where BYTES is wanted",
        ),
        (
            "shape = [-1, 512], source",
            "shape = [-7, 512], source",
            r"pipelines.p.outputs\[0\].shape\[0\]: must be at least -1, got -7",
        ),
    ]
    for before, after, words in mistakes:
        path.write_text(good.replace(before, after, 1))
        with pytest.raises(ConfigError, match=words):
            load_config(path)


def test_a_steps_tensor_that_is_also_a_pipeline_output_is_one_tensor_of_the_ensemble():
    """Triton's ensemble graph (a pipeline's config, for perf_analyzer and the like): a step's
    output that is also a pipeline's output is named as that output in its step's output_map;
    the step reading it named it "a/prob", a tensor no step of the ensemble gave."""
    outputs = [
        {"name": "prob", "datatype": "FP32", "shape": [-1], "source": "a/prob"},
        {"name": "out", "datatype": "FP32", "shape": [-1], "source": "b/angle"},
    ]
    steps = ensemble_steps(table([model_step("a", "det", "request/image"), model_step("b", "cls", "a/prob")], outputs))
    assert steps == [
        {"model_name": "det", "model_version": -1, "input_map": {"x": "image"}, "output_map": {"prob": "prob"}},
        {"model_name": "cls", "model_version": -1, "input_map": {"x": "prob"}, "output_map": {"angle": "out"}},
    ]
    given = {tensor for step in steps for tensor in step["output_map"].values()} | {"image"}
    assert all(tensor in given for step in steps for tensor in step["input_map"].values())
