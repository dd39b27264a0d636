"""docs/adding-a-codec.md, followed once: a tiny value stage with its own kernel, kept in the
tests so the library does not ship it.

=======================================  ===========================================
in the library                           here
=======================================  ===========================================
codec/stages/value/int8.py               tests/recipe/int8.py
codec/kernels/cpu/int8.py                tests/recipe/kernels/cpu/int8.py
one import in codec/stages/value/        ``import recipe.int8`` (the tests do it in a
__init__.py (the registration line)      fixture, and take it back afterwards)
tests/test_int8.py, reference in         tests/test_recipe_int8.py (its NumPy
tests/reference/                         reference inside)
tests/fixtures/int8-f32.*                tests/recipe/fixtures/int8-f32.*
a section in docs/codecs.md              docs/adding-a-codec.md, "The int8 example"
=======================================  ===========================================

The only difference in the code is where the kernel is looked up:
``backend("int8", x, package="recipe.kernels")`` instead of ``backend("int8", x)``.
"""

import contextlib
import sys


@contextlib.contextmanager
def registered():
    """The ``int8`` stage registered (its module's ``@register``: the recipe's one registration
    line) while the block runs; afterwards the registry and the codec cache are as before.
    What tests/test_recipe_int8.py runs under, and tests/cuda/'s stage without a CUDA path."""
    from codec import pipeline, stage

    assert "int8" not in stage.registered(), "int8 must not be registered by the library"
    import recipe.int8  # noqa: F401

    try:
        yield "int8"
    finally:
        stage._REGISTRY.pop("int8", None)
        pipeline._cached.cache_clear()
        sys.modules.pop("recipe.int8", None)
