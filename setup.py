"""Build the compiled reader in place: ``python setup.py build_ext --inplace`` (``make install`` runs it).

Only the C extension ``analysis._snapread`` is built here (the project is not installed as a package).
It links the machine's zlib; nothing is downloaded. Without a compiler the build fails and
``analysis.fastread`` reports the Python reader as the one in use.
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
            libraries=["z"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-unused-function"],
        )
    ],
)
