"""Datasets (synthetic, CIFAR-10, ImageFolder), transforms and seed-keyed loaders."""
