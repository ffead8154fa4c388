"""Recipes: the fast CIFAR-10 pieces (the whitened network, ResNet-9, lookahead), named by
`_target_` from conf/model/ and conf/experiment/. The core never imports them; a project made
with `scripts/new_project.py --minimal` leaves them out."""
