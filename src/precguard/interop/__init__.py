"""Reading what other precision tools recorded, so users start from the data they have.

``interop.msprobe``: dumps of Huawei MindStudio's msprobe (``mindstudio-probe``).
"""
