package data

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
)

// LoadImage reads one image file and returns its pixels exactly as an
// ImageFolder gives a sample: decoded (the decoder chosen by content),
// converted to shape.C channels as PIL's convert does, and resized to
// shape.H × shape.W with Pillow's bilinear filter, uint8 HWC. So a
// prediction sees an image as training saw its images. Errors are
// *FileError naming the path.
func LoadImage(path string, shape Shape) ([]uint8, error) {
	if err := shape.validate(); err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	if err := unsupportedByName(path); err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	encoded, _, err := readImage(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is in the FileError
		}
		return nil, &FileError{Path: path, Err: err}
	}
	plan, err := inspectImage(encoded, shape, maxDecodeBytes)
	if err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	pix, err := plan.decodeResized(encoded, shape)
	if err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	return pix, nil
}

// IsImageFile says whether a file's name ends as the images an
// ImageFolder reads do (.jpg, .jpeg, .png, .gif, .bmp, .webp, .tif,
// .tiff, and .ppm/.pgm, which it reports as unsupported), in any case.
func IsImageFile(path string) bool { return imageExtensions[strings.ToLower(filepath.Ext(path))] }
