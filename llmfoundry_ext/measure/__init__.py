"""The tools that measure a training run, apart from it (nothing on a run's path imports them): throughput rows
beside torchtitan and transformers (``benchmark``), the learning benchmark (``learning``), profiles and trace
comparison (``profiling``), the GPUs' clocks and power while a row trains (``gpu_clocks``), kill-and-resume trials
(``chaos``), random-token data (``synthetic``), the demo's run and plots (``demo``, ``plotting``), and the runs behind
scripts/ (``profile_run``, ``step_parts``, ``downstream``, ``loader``, ``trace_report``)."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout (.anchors/)
