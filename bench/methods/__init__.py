"""The save methods the bench compares, each behind the contract of `base.SaveMethod`."""
