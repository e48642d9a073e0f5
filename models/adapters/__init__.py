"""The models users bring, trained without rewriting them: how a model is called and read
(``calling``), a model by reference ``FILE.py:NAME`` or ``MODULE:NAME`` (``user``), and the views
engines other than backprop work on: an ``nn.Sequential`` as a layer stack (``sequential``), its
``nn.GRU``/``nn.LSTM``/``nn.RNN`` as recurrent layers (``recurrent``), a residual network as a
residual stack (``residual``)."""
