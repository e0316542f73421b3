package trainer

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/cnnc/cnnc/runtime/data"
)

// MetaClasses is the checkpoint metadata key of the class names, in label
// order, as a JSON list of strings: what predictions are called by.
const MetaClasses = "classes"

// ClassNames are a dataset's class names in label order: an ImageFolder's
// sub-folder names (any dataset with a Classes method), MNIST's digits
// "0".."9"; nil when the dataset has none.
func ClassNames(ds data.Dataset) []string {
	switch d := ds.(type) {
	case interface{ Classes() []string }:
		return d.Classes()
	case *data.MNIST:
		names := make([]string, d.NumClasses())
		for i := range names {
			names[i] = strconv.Itoa(i)
		}
		return names
	}
	return nil
}

// EncodeClassNames is names as MetaClasses holds them.
func EncodeClassNames(names []string) string {
	b, _ := json.Marshal(names) // a list of strings always encodes
	return string(b)
}

// DecodeClassNames reads MetaClasses from checkpoint metadata: nil when
// it is absent, an error when it is not a list of at most classes
// distinct names.
func DecodeClassNames(meta map[string]string, classes int) ([]string, error) {
	s, ok := meta[MetaClasses]
	if !ok {
		return nil, nil
	}
	var names []string
	if err := json.Unmarshal([]byte(s), &names); err != nil {
		return nil, fmt.Errorf("metadata %q is not a JSON list of class names: %v", MetaClasses, err)
	}
	if len(names) > classes {
		return nil, fmt.Errorf("metadata %q names %d classes; the model has %d", MetaClasses, len(names), classes)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return nil, fmt.Errorf("metadata %q names class %q twice", MetaClasses, n)
		}
		seen[n] = true
	}
	return names, nil
}

// ClassName is class c's name in names, or its number when names has
// none for it.
func ClassName(names []string, c int) string {
	if c >= 0 && c < len(names) {
		return names[c]
	}
	return strconv.Itoa(c)
}
