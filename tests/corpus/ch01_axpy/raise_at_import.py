# %% top
import numpy_that_does_not_exist
