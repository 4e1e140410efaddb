"""``sopfast demo``: an end-to-end run on real offline data (see :mod:`sopfast.demo.run`)."""
