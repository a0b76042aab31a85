"""The data side: the corpus of sequences (:mod:`~lmdecomp.data.corpus`), embedding shards
(:mod:`~lmdecomp.data.shards`), word alignment across tokenizers (:mod:`~lmdecomp.data.words`) and
labelled tasks (:mod:`~lmdecomp.data.tasks`). Import each from its module."""
