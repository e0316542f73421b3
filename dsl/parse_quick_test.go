package dsl

import (
	"fmt"
	"os"
	"testing"
)

func TestQuick(t *testing.T) {
	src, _ := os.ReadFile("../examples/simplecnn.cnn")
	f, err := Parse("simplecnn.cnn", src)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%+v\n%+v\n", f.Model.Stmts[6].Value.Call.Args[0].Value.Call, f.Sections[0].Stmts[3].Value)
	for _, bad := range []string{"model A(x: f32[1]) { a = @ }", "model A(x: f32[1]) { a = relu(x, }", "model A(x: f32[1]) { a = relu(x)", "model A(x: f32[1]) { a = 99999999999999999999 }"} {
		_, err := Parse("bad.cnn", []byte(bad))
		fmt.Print(err.(Diagnostics).RenderAll(map[string][]byte{"bad.cnn": []byte(bad)}))
	}
}
