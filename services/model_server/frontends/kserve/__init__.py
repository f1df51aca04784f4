"""The KServe v2 (NVIDIA Triton) protocol: ``servicer`` reads calls, ``tensors`` decodes inputs and
encodes outputs, ``answers`` makes answers and refusals, ``metadata`` answers metadata and
statistics; ``native/`` is the optional compiled front end and ``native_bridge`` hands its calls
to the same servicer."""
