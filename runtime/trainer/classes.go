package trainer

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

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

// CheckSameClasses refuses test data whose classes are not the training
// data's. Labels are positions in the class list (an ImageFolder's sorted
// folder names), so a test set without one of the classes would shift
// every later label and be scored against the wrong names, silently.
// Datasets without class names (nil) are not compared.
func CheckSameClasses(train, test data.Dataset) error {
	return SameClasses(ClassNames(train), ClassNames(test))
}

// SameClasses says how the class list got differs from want (both in
// label order), or nil when they are equal or either is unknown (nil).
func SameClasses(want, got []string) error {
	if want == nil || got == nil || slices.Equal(want, got) {
		return nil
	}
	var missing, extra []string
	for _, n := range want {
		if !slices.Contains(got, n) {
			missing = append(missing, n)
		}
	}
	for _, n := range got {
		if !slices.Contains(want, n) {
			extra = append(extra, n)
		}
	}
	var what []string
	if len(missing) > 0 {
		what = append(what, "it lacks "+quoteNames(missing))
	}
	if len(extra) > 0 {
		what = append(what, "it has "+quoteNames(extra)+" besides")
	}
	if len(what) == 0 {
		what = append(what, "they are in another order")
	}
	return fmt.Errorf("its %d classes are not the training data's %d (%s): a label is a class's position in the sorted list, so its labels would name other classes",
		len(got), len(want), strings.Join(what, "; "))
}

// quoteNames lists class names quoted, the first few of many.
func quoteNames(names []string) string {
	const shown = 5
	q := make([]string, 0, shown)
	for _, n := range names[:min(len(names), shown)] {
		q = append(q, strconv.Quote(n))
	}
	s := strings.Join(q, ", ")
	if len(names) > shown {
		s += fmt.Sprintf(" and %d more", len(names)-shown)
	}
	return s
}
