"""Model families, one folder each; each declares itself in its ``declaration.py``
(:mod:`omni_stream.family_registry` finds them).
"""
