"""Build the C extensions in place: ``python setup.py build_ext --inplace`` (``make install`` runs it).

Only the C extensions are built here (the project is not installed as a package):
``analysis._snapread``, the compiled reader, which links the machine's zlib, and
``analysis.allocator._replaycore``, the per-event loops of the allocator model and of the recorded
replay. Nothing is downloaded. Without a compiler the build fails, ``analysis.fastread``
reports the Python reader and ``analysis.allocator.compiled`` the Python loops as the ones in use.

-O3: the read and the policy replays 2-5% faster than at -O2 (four alternating builds on the 460 MB
benchmark: read 0.363-0.391 s against 0.377-0.393 s, four replays 0.57-0.58 s against 0.595-0.597 s),
the same results (tests/analysis/test_replaycore.py, test_compiled_reader.py, test_hostile.py).
"""

from setuptools import Extension, setup

setup(
    name="oomscope-snapread",
    version="0.1.0",
    packages=[],
    ext_modules=[
        Extension(
            "analysis._snapread",
            ["analysis/_snapread.c"],
            libraries=["z", "dl"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wno-unused-function"],
        ),
        Extension(
            "analysis.allocator._replaycore",
            ["analysis/allocator/_replaycore.c", "analysis/allocator/_policycore.c"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function"],
        ),
    ],
)
