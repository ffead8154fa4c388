"""Multi-label classification, beside the core (named by `_target_` in conf/): the
`multilabel_bce` objective, the `synthetic_multilabel` data and the image-folder-plus-CSV
builder (`data=csv_labels`). The core's `repro.core.tasks.MULTI_LABEL` says what evaluation computes
for them."""
