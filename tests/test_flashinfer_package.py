"""adapters/flashinfer_package.py: the include closure that decides what of FlashInfer travels to the GPU machine."""

from adapters.flashinfer_package import include_closure


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
