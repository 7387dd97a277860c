"""A model family and a kind of request of their own, written as a plugin package would write them: this folder
alone (the package is never edited). ``kind`` declares the kind (its request, role protocol and pipeline),
``family`` two families (a counter of the new kind, a word-reverser of the text kind), ``declaration`` what they
are. Tests register it with ``declare_family``/``register_kind`` or through a package's entry points."""
