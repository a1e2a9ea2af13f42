"""The vocabulary at the bottom: errors, specs, mesh axes, layouts, the plan as data.

Every other layer may import these modules; they import nothing of autopar outside ``core``
(a ``ModelSpec`` loads the model zoo only to build the model it names). See
``docs/architecture.md``.
"""
