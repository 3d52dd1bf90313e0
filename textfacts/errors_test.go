package textfacts

import "testing"

func TestLastErrorLine(t *testing.T) {
	tests := []struct{ out, want string }{
		{"ok\nall good", ""},
		{"Traceback (most recent call last):\n  File \"x.py\", line 3\n    raise ValueError(x)\nValueError: boom\n", "ValueError: boom"},
		{"12:    except KeyError:\n13:        pass", ""},
		{"[ctxpipe masked this tool result: bash command=\"make\"; 90 tokens, 4 lines hidden; last error: make: *** [all] Error 2. Run the call again to see it.]", "make: *** [all] Error 2"},
	}
	for _, tt := range tests {
		if got := LastErrorLine(tt.out); got != tt.want {
			t.Errorf("LastErrorLine(%q) = %q, want %q", tt.out, got, tt.want)
		}
	}
}
