"""The capstone GPT (chapter 13): a float64 NumPy reference model (:mod:`.reference`), the same model
built from registered course kernels on the CPU or the GPU (:mod:`.gpt`), and its corpus and
character-level tokenizer (:mod:`.data`)."""
from .reference import Config, ReferenceGPT, adamw_step, init_params, param_shapes  # noqa: F401
