// Package data loads training data for cnnc trainers and hands it out in
// batches of uint8 HWC images (what the device input takes) with int32
// labels. Every error names the file or folder it is about.
//
// Sources, all behind one Dataset interface:
//
//   - MNIST IDX files, plain or gzipped (LoadMNIST; *MNIST is a Dataset of
//     28x28x1 images).
//   - ImageFolder trees in torchvision's layout, ROOT/CLASS/.../IMAGE
//     (OpenImageFolder). Classes are the sorted sub-folder names, labels
//     0..N-1; files are ordered as torchvision's make_dataset orders them.
//     Images are decoded with the standard library and golang.org/x/image,
//     converted to RGB or grayscale like PIL's convert("RGB") / convert("L")
//     and resized like torchvision's Resize((H, W)) on a PIL image: Pillow's
//     antialiased bilinear filter, reproduced bit for bit (resize.go).
//
// An ImageFolder is decoded once, in parallel, when it is opened: the bad
// files must be known before the sample indices are fixed (SkipBad drops
// them), and the decoded images go into one cache file in the user's cache
// folder, never the data folder (cache.go), so that later runs skip
// decoding. Serving a sample is then a read of H*W*C bytes at a known
// offset of that file.
//
// Every file is untrusted input: only regular files are read, and no size
// a header states is believed before it has been checked against the file
// (mnist.go, limits.go, cache.go).
//
// The Loader turns any Dataset into batches: a per-epoch permutation that
// is a pure function of (seed, epoch) so that a resumed run can reproduce
// it (Order), worker goroutines assembling batches ahead of the consumer
// into a bounded queue of recycled buffers, and the last partial batch
// kept, as PyTorch's DataLoader does by default.
package data
