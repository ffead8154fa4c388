"""Optional parts of the loop that keep state of their own beside the model (the weight
average): each plugs in through the callback interface, and the loop names none of them."""
