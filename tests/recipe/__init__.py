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
