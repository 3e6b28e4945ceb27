"""adapters/flashinfer_package.py: the include closure that decides what of FlashInfer travels to the GPU machine."""

import tarfile

import pytest

from adapters.flashinfer_package import build, include_closure


def test_the_closure_follows_quoted_and_angled_includes_and_leaves_system_headers_out(tmp_path):
    include, csrc = tmp_path / "include", tmp_path / "csrc"
    (include / "lib" / "detail").mkdir(parents=True)
    csrc.mkdir()
    (csrc / "kernel.cu").write_text('#include <cuda_runtime.h>\n#include "local.h"\n  #  include <lib/a.cuh>\n')
    (csrc / "local.h").write_text("// nothing\n")
    (include / "lib" / "a.cuh").write_text('#include "detail/b.cuh"\n#include <vector>\n')
    (include / "lib" / "detail" / "b.cuh").write_text("#ifdef NEVER\n#include <lib/c.cuh>\n#endif\n")
    (include / "lib" / "c.cuh").write_text("#include <lib/a.cuh>\n")  # a cycle back
    (include / "lib" / "unused.cuh").write_text("")
    found = include_closure([csrc / "kernel.cu"], [include, csrc])
    assert {p.relative_to(tmp_path).as_posix() for p in found} == {
        "csrc/kernel.cu", "csrc/local.h", "include/lib/a.cuh", "include/lib/detail/b.cuh", "include/lib/c.cuh"}


def _fake_sdist(tmp_path):
    """A source distribution shaped like flashinfer-python's: package, include/, csrc/, 3rdparty/."""
    top = tmp_path / "src" / "flashinfer_python-0.0.0"
    files = {
        "flashinfer/__init__.py": "",
        "flashinfer/jit/attention.py": ('decl = "#include<flashinfer/variants.cuh>"\n'
                                        'hopper = "#include<flashinfer/hopper/v.cuh>"\n'),
        "flashinfer/data/stale.txt": "the build backend's links, not carried",
        "include/flashinfer/variants.cuh": "",
        "include/flashinfer/hopper/v.cuh": "#include <cute/tensor.hpp>\n",
        "include/flashinfer/decode.cuh": '#include "utils.cuh"\n',
        "include/flashinfer/utils.cuh": "",
        "include/flashinfer/unused.cuh": "",
        "csrc/batch_decode.cu": "#include <flashinfer/decode.cuh>\n",
        "csrc/batch_prefill.cu": "#include <flashinfer/prefill.cuh>\n",
        "include/flashinfer/prefill.cuh": "",
        "csrc/norm.cu": "",
        "3rdparty/cutlass/include/cute/tensor.hpp": "",
        "3rdparty/spdlog/include/spdlog/spdlog.h": "",
    }
    for name, text in files.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    sdist = tmp_path / "flashinfer_python-0.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(top, arcname=top.name)
    return sdist


@pytest.mark.parametrize("tensor_cores", [True, False])
def test_the_carry_holds_the_package_and_only_the_decode_paths_sources(tmp_path, tensor_cores):
    out = tmp_path / "carry"
    written = dict(build(_fake_sdist(tmp_path), out, tensor_cores=tensor_cores))
    data = {name.removeprefix("flashinfer/data/") for name in written if name.startswith("flashinfer/data/")}
    expected = {"include/flashinfer/variants.cuh", "include/flashinfer/decode.cuh", "include/flashinfer/utils.cuh",
                "csrc/batch_decode.cu"}
    if tensor_cores:
        expected |= {"csrc/batch_prefill.cu", "include/flashinfer/prefill.cuh"}
    assert data == expected
    assert {"flashinfer/__init__.py", "flashinfer/jit/attention.py"} <= set(written)
    for folder in ("cutlass/include", "spdlog/include", "csrc", "include"):  # the JIT names each on its include path
        assert (out / "flashinfer" / "data" / folder).is_dir()
    assert (out / "MANIFEST.txt").read_text().splitlines()[-1].endswith(f"total ({len(written)} files)")
