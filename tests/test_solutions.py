"""FlashInfer-Bench Solution files as ``--impl``: read and checked, laid out, imported or built, called in their
convention; the destination-passing claims fail the planted wrong kernels and pass the correct ones."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from gqa_decode_fuzz.engine import solutions
from gqa_decode_fuzz.engine.destinations import DestinationError, call_in_destination_style
from gqa_decode_fuzz.engine.target import ImplSpecError, load_callable, load_target
from gqa_decode_fuzz.reference import definitions
from tests import solution_files
from tests.pytest_runs import clean_environment, run_module, run_pytest

CENTRAL = "properties/test_decode.py::test_output_and_lse_within_error_bound"
DESTINATIONS = "properties/test_destinations.py"  # holds a destination-passing call to the bound too


def _run(solution: Path, failures: Path, *args: str):
    claim = CENTRAL if "returning" in solution.stem else DESTINATIONS  # one claim each keeps CI cheap
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(failures), GQA_DECODE_REPORT_DIR="none")
    return run_pytest(claim, "-n0", "--hypothesis-profile=ci", "--max-examples=3", f"--impl={solution}", *args,
                      env=env)


@pytest.mark.parametrize(("variant", "verdict"), [
    ("python_returning", "passed"),
    ("python_dps", "passed"),
    ("python_dps_last_head_unwritten", "unwritten (first at seq=0, head=31, dim=0)"),
    ("python_dps_row_past_output", "wrote outside output: 4096 elements after its end changed"),
    ("triton_returning", "passed"),
    ("triton_dps", "passed"),
    ("triton_dps_last_head_unwritten", "unwritten (first at seq=0, head=31, dim=0)"),
])
def test_a_solution_file_gets_its_verdict(tmp_path, variant, verdict):
    result = _run(solution_files.write(tmp_path, variant), tmp_path / "failures")
    said = result.stdout + result.stderr
    assert f"solution {variant!r}" in said, said[-3000:]
    if verdict == "passed":
        assert result.returncode == 0 and "1 passed" in said.splitlines()[-1], said[-3000:]
    else:
        assert result.returncode == 1 and verdict in said, said[-3000:]
        assert "DestinationError" in said


def test_a_destination_failure_replays_from_the_solution_file(tmp_path):
    path = solution_files.write(tmp_path, "python_dps_row_past_output")
    _run(path, tmp_path / "failures", "-x")
    case_file = next((tmp_path / "failures").glob("*.pt"))
    replay = run_module("gqa_decode_fuzz.record.repro", str(case_file), "--device", "cpu", "--no-png")
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "solution : python_dps_row_past_output" in replay.stdout
    assert "wrote outside output" in replay.stdout and "replaying another" not in replay.stdout
    path.write_text(path.read_text().replace("test variant", "changed variant"))
    changed = run_module("gqa_decode_fuzz.record.repro", str(case_file), "--device", "cpu", "--no-png")
    assert "replaying another implementation than the run tested" in changed.stdout


def test_the_convention_not_stated_is_read_from_the_signature(tmp_path):
    returning = load_target(str(solution_files.write(tmp_path, "python_returning", spec={
        "destination_passing_style": None})))
    assert not returning.destination_passing_style and "the spec does not say" in returning.convention
    dps = load_target(str(solution_files.write(tmp_path, "python_dps")))
    assert dps.destination_passing_style and "takes 8 arguments" in dps.convention


@pytest.mark.parametrize(("variant", "trouble"), [("python_dps", None),
                                                  ("python_dps_row_past_output", "wrote outside output")])
def test_the_adapter_runs_apart_from_the_implementation(tmp_path, variant, trouble):
    """What an isolated run does: the child calls ``load_callable``'s function (destinations as its last
    arguments), the checker's process adapts whatever forwards the call to it, and checks the guard bands."""
    from gqa_decode_fuzz.generation.cases import DecodeCase, build

    function, _ = load_callable(str(solution_files.write(tmp_path, variant)))
    forwarded = lambda *args: function(*args)  # noqa: E731 - stands in for the call sent to a child
    inputs = build(DecodeCase(lengths=(2, 0, 3)), observe=False)
    if trouble is None:
        output, lse = call_in_destination_style(forwarded, definitions.SEED, tuple(inputs)[:6])
        assert output.shape == (3, 32, 128) and bool((lse[1] == float("-inf")).all())
    else:
        with pytest.raises(DestinationError, match=trouble):
            call_in_destination_style(forwarded, definitions.SEED, tuple(inputs)[:6])


def test_a_definition_that_disagrees_is_refused(tmp_path):
    path = solution_files.write(tmp_path, "python_dps")
    other = definitions.by_name("gqa_paged_decode_h32_kv8_d128_ps1")
    with pytest.raises(ImplSpecError, match="implements 'gqa_paged_decode_h32_kv4_d128_ps1' but --definition="):
        load_target(str(path), definition=other)
    assert load_target(str(path)).definition == definitions.SEED
    result = run_pytest("properties/test_decode.py", "--collect-only", "-q", f"--impl={path}",
                        "--definition=gqa_paged_decode_h32_kv8_d128_ps1",
                        env=clean_environment(GQA_DECODE_REPORT_DIR="none"))
    assert result.returncode == 4 and "implements 'gqa_paged_decode_h32_kv4_d128_ps1' but --definition" in \
        result.stderr, result.stdout + result.stderr


@pytest.mark.parametrize(("change", "message"), [
    ({"sources": [{"path": "/etc/main.py", "content": "x"}]}, "is absolute"),
    ({"sources": [{"path": "../main.py", "content": "x"}]}, "climbs out"),
    ({"sources": [{"path": "main.py", "content": "a"}, {"path": "main.py", "content": "b"}]}, "appears twice"),
    ({"spec": {"entry_point": "other.py::run"}}, "not among the sources"),
    ({"spec": {"entry_point": "main.py:run"}}, "must be 'file::function'"),
    ({"spec": {"language": "tilelang"}}, "spec.language 'tilelang' is not supported"),
    ({"spec": {"destination_passing_style": "yes"}}, "must be true or false"),
    ({"spec": {"language": "cuda", "entry_point": "main.py::run"}}, "entry file must be one of"),
    ({"name": ""}, "'name' must be a non-empty string"),
])
def test_a_malformed_solution_is_refused_naming_the_field(tmp_path, change, message):
    with pytest.raises(solutions.SolutionError, match=message):
        solutions.read_solution(solution_files.write(tmp_path, "python_dps", **change))


def _cuda(tmp_path: Path, binding: str | None = "torch", bound: bool = True) -> Path:
    main = ("#include <torch/extension.h>\n"
            "std::vector<torch::Tensor> decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,\n"
            "    torch::Tensor kv_indptr, torch::Tensor kv_indices, double sm_scale);\n"
            + ("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"run\", &decode); }\n" if bound else ""))
    kernel = ("#include <torch/extension.h>\n"
              "std::vector<torch::Tensor> decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,\n"
              "    torch::Tensor kv_indptr, torch::Tensor kv_indices, double sm_scale) {\n"
              "  auto lse = torch::zeros({q.size(0), q.size(1)}, q.options().dtype(torch::kFloat));\n"
              "  return {torch::zeros_like(q), lse};\n"
              "}\n")
    spec = {"language": "cuda", "entry_point": "main.cpp::run", "destination_passing_style": False}
    if binding:
        spec["binding"] = binding
    return solution_files.write(tmp_path, "python_returning", spec=spec, sources=[
        {"path": "main.cpp", "content": main}, {"path": "src/kernel.cu", "content": kernel}])


def test_a_cuda_solution_is_laid_out_for_a_torch_extension(tmp_path):
    solution = solutions.read_solution(_cuda(tmp_path))
    assert solution.binding == "torch" and solution.language == "cuda"
    assert solutions.read_solution(_cuda(tmp_path, binding=None)).binding == "torch"  # PYBIND11_MODULE: torch's
    folder = solutions.lay_out(solution)
    package = folder / next(p.name for p in folder.iterdir())
    assert (package / "main.cpp").is_file() and (package / "src" / "kernel.cu").is_file()
    assert Path(tempfile.gettempdir()) in folder.parents


@pytest.mark.parametrize(("binding", "bound"), [("tvm-ffi", True), (None, False)])
def test_other_cuda_bindings_are_refused_as_not_supported(tmp_path, binding, bound):
    with pytest.raises(solutions.SolutionError, match="is not supported yet: the suite builds C\\+\\+/CUDA"):
        solutions.read_solution(_cuda(tmp_path, binding=binding, bound=bound))


def test_a_cuda_solution_builds_and_runs(tmp_path):
    torch = pytest.importorskip("torch")
    if shutil.which("nvcc") is None or not torch.cuda.is_available():
        pytest.skip("building a CUDA solution needs nvcc and a GPU")
    target = load_target(str(_cuda(tmp_path)))
    q = torch.zeros(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    output, lse = target.function(q, None, None, None, None, None)
    assert output.shape == (2, 32, 128) and lse.shape == (2, 32)


PUBLIC = sorted((Path(__file__).parent / "solutions").glob("gqa_paged_decode_*.json"))


@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.name[:40])
def test_the_public_accelopt_solutions_are_read_and_called_as_they_return(path):
    """Their kernels autotune over several configs (GPU only); what CI can check is how the suite will call them:
    the spec omits destination_passing_style, and their run takes the definition's six arguments."""
    solution = solutions.read_solution(path)
    assert solution.author == "AccelOpt" and solution.language == "triton"
    assert solution.destination_passing_style is None
    assert path.name.startswith(solution.definition)
    result = run_pytest("properties/test_decode.py", "--collect-only", "-q", f"--impl={path}",
                        env=clean_environment(GQA_DECODE_REPORT_DIR="none"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"definition {solution.definition}" in result.stdout  # the solution's own
    assert "return style: the spec does not say, and run takes the definition's 6 arguments" in result.stdout
