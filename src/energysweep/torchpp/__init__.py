"""One PyTorch model-parallel toolkit: what the PyTorch backend and the training scenario share.

One replica of the model is ``tp * pp`` ranks of the 3-D mesh ``("dp", "pp", "tp")`` built by
:func:`energysweep.dist.make_context`:

* **PP** (:mod:`.load`): pipeline stage ``s`` owns the contiguous decoder layers
  ``layout.stage_layers(L, s)``; the embedding lives on stage 0, the final norm and ``lm_head`` on
  the last stage. Only the owned tensors are read from the checkpoint
  (:func:`.load.load_stage_model`).
* **TP** (:mod:`.tp`): inside a stage, every decoder layer is sharded over the mesh's ``"tp"`` axis
  with ``torch.distributed.tensor.parallel.parallelize_module``: q/k/v and gate/up
  ``ColwiseParallel``, o/down ``RowwiseParallel``. The attention heads divide with the weights
  because HF Llama-style attention reshapes with ``view(*shape, -1, head_dim)`` (local heads =
  heads / tp) and keeps ``num_key_value_groups`` (a ratio, unchanged by an even split); the
  embedding (vocab rows) and ``lm_head`` (vocab columns, gathered) are sharded too when tp divides
  the vocabulary. By default each sharded module is then swapped for a plain-tensor twin on the
  same shards with the same explicit collective ("local" mode, :func:`.tp.apply_tensor_parallel`):
  identical numbers, without DTensor's per-op host dispatch in the measured decode loop.
* **Stage forward** (:mod:`.stage`): position ids, the 4-D attention mask and the layer loop of
  one stage, the same for decoding and for training (:class:`.stage.TrainStage`).
* **Decoding** (:mod:`.decode`): :class:`.decode.StageRunner`, the one greedy loop for every layout.

Why ``parallelize_module`` rather than transformers' ``DistributedConfig(tp_size=...)``:
transformers derives its own ("pp", "fsdp", "tp") mesh over the whole launched world inside
``from_pretrained`` and has no axis for independent inference replicas, whereas here a TP group
must be the "tp" slice of one stage of one replica of *our* 3-D mesh, and our stage split decides
which layers a rank loads at all. ``parallelize_module`` takes exactly that sub-mesh and composes
with the split. ``DistributedConfig(pp_size=...)`` is not used: its KV-cache generation gives
wrong tokens on left-padded batches (/work/shared/reference/cpu-parallel.md).
"""
