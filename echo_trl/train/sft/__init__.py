"""The SFT stage's pieces around TRL's ``SFTTrainer``: per-token role weights (:mod:`.weights`), the datasets they
come from (:mod:`.prepare`: TRL's own preparation, with roles added to conversations with tool messages by
:mod:`.conversation` and to ECHO trajectory datasets by :mod:`.trajectories`), the episode filter
(:mod:`.reward_filter`) and the weighted loss (:mod:`.loss`)."""
