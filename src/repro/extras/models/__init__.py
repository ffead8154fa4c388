"""Models: a small fast CNN, the CIFAR ResNet family, and any torchvision classifier."""
