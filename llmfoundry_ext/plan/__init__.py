"""The run plan: what a run will do on its machine (``llmfoundry_ext.machine``), settled once before training
(``run_plan.settle``) from the config, with its predictions (``memory``, ``speed``). Everything after preflight reads
the plan; ``scripts/plan.py`` prints it for a machine described on the command line (``table``)."""
