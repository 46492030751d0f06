"""The one home of other projects' internals: each function here reads or sets something that Ray, Ray Tune or MLflow
keep private, names the versions it was read from, and is tested against the installed version
(``tests/test_compat.py``), so an upgrade that moves it fails in one place.

``ray``: Ray core (the local node, resources, the autoscaler's report, the worker mode); ``ray_tune``: Ray Tune's
``OptunaSearch`` and ``Tuner`` fields; ``mlflow``: the MLflow UI's saved runs view; ``versions``: the versions
they were read from, and a note naming a newer one installed.
"""
