"""Progress lines from the build's output: make's and ninja's steps, and nvcc's one device compile per
architecture (lines as CMake 3.25, make 4.3, ninja 1.11 and nvcc 13.0 -v print them), streamed as they come."""

from __future__ import annotations

import time
from pathlib import Path

from attnres_export.plugins import build
from attnres_export.plugins.build_progress import BuildProgress, arch_count

CICC = ('#$ "$CICC_PATH/cicc" --c++17 --static-host-stub --orig_src_file_name "/src/attnResAggregatePlugin/'
        'attnResAggregateKernel.cu" --orig_src_path_name "/src/x.cu" --allow_managed   -arch compute_{arch} -m64 '
        '--no-version-ident -ftz=0\n')


def test_arch_count_is_one_per_architecture_number() -> None:
    assert arch_count("80-real;86-real;89-real;90") == 4
    assert arch_count("87-real;110") == 2
    assert arch_count("90a") == 1


def test_make_and_ninja_steps_name_the_target_and_the_file() -> None:
    progress = BuildProgress("90")
    make = "[ 40%] Building CUDA object CMakeFiles/attnres_kernel_objects.dir/attnResAggregatePlugin/x.cu.o\n"
    assert progress.feed(make) == "[40%] kernels: compiling x.cu"
    ninja = "[3/12] Building CXX object CMakeFiles/attnres_plugin_objects.dir/common/attnresPluginCommon.cpp.o\n"
    assert progress.feed(ninja) == "[3/12] TensorRT plugins: compiling attnresPluginCommon.cpp"
    entry = "[ 90%] Building CXX object CMakeFiles/attnres_trt_dyn.dir/api/dynamicPlugins.cpp.o\n"
    assert progress.feed(entry) == "[90%] libattnres_trt_dyn.so: compiling dynamicPlugins.cpp"
    link = "[100%] Linking CXX shared library /cache/abc/lib/libattnres_trt.so\n"
    assert progress.feed(link) == "[100%] linking libattnres_trt.so"


def test_each_architecture_of_a_kernel_file_is_one_line_counted_per_file() -> None:
    progress = BuildProgress("80-real;86-real;89-real;90")
    lines = [progress.feed(CICC.format(arch=arch)) for arch in ("80", "86", "89", "90")]
    assert lines == [f"kernels: attnResAggregateKernel.cu for sm_{arch} (architecture {i} of 4)"
                     for i, arch in enumerate(("80", "86", "89", "90"), start=1)]
    other = CICC.replace("attnResAggregateKernel.cu", "residualScoreAttentionKernel.cu").format(arch="80")
    assert progress.feed(other) == "kernels: residualScoreAttentionKernel.cu for sm_80 (architecture 1 of 4)"


def test_other_output_says_nothing() -> None:
    progress = BuildProgress("90")
    for line in ("[ 57%] Built target attnres_kernel_objects\n", "#$ ptxas -arch=sm_90 -m64 x.ptx -o x.cubin\n",
                 "#$ _NVVM_BRANCH_=nvvm\n", "-- Configuring done\n", "\n"):
        assert progress.feed(line) is None


def test_build_output_streams_line_by_line_and_silence_ticks(tmp_path: Path, monkeypatch) -> None:
    """A line reaches the progress callback while the step still runs, the log gets everything, and a silent
    stretch calls ``tick`` (which the build turns into "still compiling" lines)."""
    monkeypatch.setattr(build, "TICK_SECONDS", 0.05)
    started = time.monotonic()
    arrived: list[tuple[str, float]] = []
    ticks: list[float] = []
    log = tmp_path / "build.log"
    code, output = build._run(["sh", "-c", "echo first; sleep 1; echo second; exit 3"], log,
                              progress=lambda line: arrived.append((line, time.monotonic() - started)),
                              tick=lambda: ticks.append(time.monotonic() - started))
    assert code == 3 and output == "first\nsecond\n"
    assert [line for line, _ in arrived] == ["first\n", "second\n"]
    assert arrived[0][1] < 0.8 <= arrived[1][1], "the first line came before the step ended"
    assert any(0.1 < t < 1.0 for t in ticks), "silence between the lines ticked"
    assert log.read_text().endswith("first\nsecond\n")
