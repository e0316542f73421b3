package ops

import (
	"github.com/cnnc/cnnc/dsl"
)

// ArgKind is the kind of value a keyword argument takes.
type ArgKind int

const (
	ArgInt       ArgKind = iota // a positive (or, with Min 0, non-negative) integer
	ArgIntPair                  // 3 or [3,5]
	ArgFloat                    // a number
	ArgBool                     // true or false
	ArgFloatPair                // [0.9, 0.999]
	ArgString                   // "data/train"
	ArgSize                     // 64MiB
	// ArgIntPairOrSame is ArgIntPair or the string "same" (conv padding).
	ArgIntPairOrSame
	// ArgCustom is checked by the code that reads it (an optimizer call).
	ArgCustom ArgKind = -1
)

// ArgSpec describes one keyword argument: its kind, bounds and docs. The
// compiler checks a call's arguments against it, each error positioned at
// the argument.
type ArgSpec struct {
	Name     string
	Kind     ArgKind
	Required bool
	Min      float64 // inclusive lower bound for numbers
	Max      float64 // exclusive upper bound (0: none)
	// MaxInt is an inclusive upper bound for integers (0: none) and MaxWhy
	// says why, for the error.
	MaxInt int64
	MaxWhy string
	// Positive: a number must be above 0 (and, being used as a float32,
	// at least float32's smallest normal number).
	Positive bool
	// Default is the value when the argument is left out, as the docs show
	// it ("1", "the kernel"); empty for required arguments.
	Default string
	// Note is a further constraint for the docs ("at most half the kernel").
	Note string
	Doc  string
}

// Args holds a call's checked keyword arguments.
type Args map[string]*dsl.Expr

// Has reports whether the call gave argument k.
func (a Args) Has(k string) bool { return a[k] != nil }

// Int is integer argument k, or def.
func (a Args) Int(k string, def int64) int64 {
	if e := a[k]; e != nil {
		return e.Int
	}
	return def
}

// Pair is an integer-pair argument (3 means [3,3]), or [def,def].
func (a Args) Pair(k string, def int64) [2]int64 {
	e := a[k]
	switch {
	case e == nil:
		return [2]int64{def, def}
	case e.Kind == dsl.ExprList:
		return [2]int64{e.List[0].Int, e.List[1].Int}
	}
	return [2]int64{e.Int, e.Int}
}

// Float is number argument k, or def.
func (a Args) Float(k string, def float64) float64 {
	if e := a[k]; e != nil {
		return Number(e)
	}
	return def
}

// Bool is boolean argument k, or def.
func (a Args) Bool(k string, def bool) bool {
	if e := a[k]; e != nil {
		return e.Ident == "true"
	}
	return def
}

// String is string argument k, or def.
func (a Args) String(k, def string) string {
	if e := a[k]; e != nil && e.Kind == dsl.ExprString {
		return e.String
	}
	return def
}

// Number is a checked number's value.
func Number(e *dsl.Expr) float64 {
	if e.Kind == dsl.ExprInt {
		return float64(e.Int)
	}
	return e.Float
}
