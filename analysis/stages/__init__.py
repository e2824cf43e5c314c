"""The report's stages, one module a stage, each taking typed inputs and returning a frozen result.

``analysis.report`` wires them in order (docs/architecture.md, "The report's stages"); the ``whatif``
command reaches its answer through the same ones. A stage imports the stages before it and never
``analysis.report`` (``tests/test_architecture_stages.py``).
"""
