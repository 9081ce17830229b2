"""The runtime: the layer between a model and its kernels (chapter 14).

    launch     launch plans: the launches of one step recorded once, their arguments packed, replayed with one
               driver call each (``Plan``)
    graphs     CUDA graphs over numba.cuda launches: a recorded step captured once and replayed with one
               ``cuGraphLaunch`` (``capture``, ``StepRunner``), with a one-line fallback where capture is
               impossible (CPU, simulator); a graph node's arguments can change between replays (``Graph.set_launch``),
               which is how one captured training step serves every step (``GPT.trainer``)

The dispatcher (which registered variant plays a role for a shape) lives beside them.
"""
