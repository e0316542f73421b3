package early

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Help and version are found as the command line would read them: not
// after "--", not as a flag's value.
func TestWants(t *testing.T) {
	values := []string{"log", "data"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "help"},
		{[]string{"--data", "x", "--help"}, "help"},
		{[]string{"--version"}, "version"},
		{[]string{"-v"}, "version"},
		{[]string{"--log", "-h"}, ""},
		{[]string{"--log=x", "-h"}, "help"},
		{[]string{"--quiet", "-h"}, "help"},
		{[]string{"--", "-h"}, ""},
		{[]string{"--bench", "1"}, ""},
		{nil, ""},
	} {
		assert.Equal(t, c.want, Wants(c.args, values), "%q", c.args)
	}
	assert.Equal(t, "trainer", base("/usr/bin/trainer"))
	assert.Equal(t, "a x b x", replaceAll("a "+ProgramPlaceholder+" b "+ProgramPlaceholder, ProgramPlaceholder, "x"))
}
