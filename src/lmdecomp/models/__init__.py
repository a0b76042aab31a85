"""The model side: where a model comes from (:mod:`~lmdecomp.models.sources`), the small models
the pipeline pretrains (:mod:`~lmdecomp.models.zoo`, :mod:`~lmdecomp.models.tokenizing`), the
masked-LM training loop (:mod:`~lmdecomp.models.train`, :mod:`~lmdecomp.models.masking`) and
embedding extraction (:mod:`~lmdecomp.models.embed`, :mod:`~lmdecomp.models.pooling`,
:mod:`~lmdecomp.models.attention`). Import each from its module."""
