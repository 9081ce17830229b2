# %% stub
