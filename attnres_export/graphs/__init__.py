"""The ONNX side of the op set: schemas, decompositions, targets, pattern fusion, inspection."""
