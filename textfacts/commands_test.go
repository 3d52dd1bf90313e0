package textfacts

import (
	"fmt"
	"testing"
)

func TestPathsInCommand(t *testing.T) {
	tests := []struct {
		cmd  string
		want []string
	}{
		{"cat src/x.py", []string{"src/x.py"}},
		{"cd /testbed && sed -n '230,250p' astropy/modeling/separable.py", []string{"/testbed", "astropy/modeling/separable.py"}},
		{"grep -n foo ./pkg/a.go:12: setup.cfg", []string{"pkg/a.go", "setup.cfg"}},
		{"python -c 'import os.path; print(1.5, x/2)' > /dev/null 2>&1", nil},
		{"curl https://example.com/a.py -o out.json", []string{"out.json"}},
		{"cat > fix.py << 'EOF'\nimport a/b.py\nEOF", []string{"fix.py"}},
		{"ls ~/proj/ ../up/ --color=auto", []string{"~/proj/", "../up/"}},
		{"echo done", nil},
	}
	for _, tt := range tests {
		got := pathsInCommand(tt.cmd)
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("pathsInCommand(%q) = %q, want %q", tt.cmd, got, tt.want)
		}
	}
}
