package data

import "fmt"

// Shape is the size of one image sample: height, width and channels (1 for
// grayscale, 3 for RGB). Pixels are stored HWC: row by row, and within a
// pixel its C channel values.
type Shape struct{ H, W, C int }

// Size is the number of bytes of one image.
func (s Shape) Size() int { return s.H * s.W * s.C }

func (s Shape) String() string { return fmt.Sprintf("%dx%dx%d", s.H, s.W, s.C) }

func (s Shape) validate() error {
	if s.H <= 0 || s.W <= 0 || s.H > 1<<14 || s.W > 1<<14 {
		return fmt.Errorf("image size %dx%d is not usable (want 1..16384 on each side)", s.H, s.W)
	}
	if s.C != 1 && s.C != 3 {
		return fmt.Errorf("images have %d channels; cnnc reads 1 (grayscale) or 3 (RGB)", s.C)
	}
	return nil
}

// Dataset is a fixed, indexed set of labelled images of one Shape. A trainer
// reads MNIST and ImageFolder data through it alike. ReadImage and Label
// may be called from several goroutines at once.
type Dataset interface {
	// Len is the number of samples; indices run from 0 to Len()-1.
	Len() int
	// Shape is the size of every image.
	Shape() Shape
	// NumClasses is the number of labels; every label is in [0, NumClasses).
	NumClasses() int
	// Label returns sample i's class.
	Label(i int) int32
	// ReadImage copies sample i's pixels (Shape().Size() bytes, HWC) to dst.
	ReadImage(i int, dst []uint8) error
	// Close releases the files the dataset holds open.
	Close() error
}

var (
	_ Dataset = (*MNIST)(nil)
	_ Dataset = (*ImageFolder)(nil)
)

// Len is the number of images in the split.
func (m *MNIST) Len() int { return m.Images.N }

// Shape is MNIST's image size, 28x28x1.
func (m *MNIST) Shape() Shape { return Shape{H: m.Images.H, W: m.Images.W, C: 1} }

// NumClasses is 10: the digits.
func (m *MNIST) NumClasses() int { return 10 }

// Label returns sample i's digit.
func (m *MNIST) Label(i int) int32 { return int32(m.Labels[i]) }

// ReadImage copies sample i's pixels to dst.
func (m *MNIST) ReadImage(i int, dst []uint8) error {
	if err := checkReadArgs(m, i, dst); err != nil {
		return err
	}
	copy(dst, m.Images.Image(i))
	return nil
}

// Close does nothing: MNIST lives in memory.
func (m *MNIST) Close() error { return nil }

func checkReadArgs(ds Dataset, i int, dst []uint8) error {
	if i < 0 || i >= ds.Len() {
		return fmt.Errorf("sample %d out of range [0, %d)", i, ds.Len())
	}
	if want := ds.Shape().Size(); len(dst) != want {
		return fmt.Errorf("sample %d: destination holds %d bytes, an image is %d", i, len(dst), want)
	}
	return nil
}

// OpenDataset opens a data-block source for a trainer: kind "mnist" (the
// split "train" when train is set, else "t10k", from the four IDX files in
// path) or "imagefolder" (OpenImageFolder with opts). opts.Shape is the
// model's input; MNIST must match it, since it is not resized.
func OpenDataset(kind, path string, train bool, opts ImageFolderOptions) (Dataset, error) {
	switch kind {
	case "mnist":
		split := "t10k"
		if train {
			split = "train"
		}
		m, err := LoadMNIST(path, split)
		if err != nil {
			return nil, err
		}
		if opts.Shape != (Shape{}) && opts.Shape != m.Shape() {
			return nil, fmt.Errorf("%s: MNIST images are %v (HxWxC) but the model's input is %v", path, m.Shape(), opts.Shape)
		}
		return m, nil
	case "imagefolder":
		return OpenImageFolder(path, opts)
	}
	return nil, fmt.Errorf("%s: unknown data source kind %q (want mnist or imagefolder)", path, kind)
}
