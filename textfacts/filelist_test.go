package textfacts

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
)

// FileItems names every file while the list fits, then braces the files of
// a directory, then folds the deepest directories level by level.
func TestFileItems(t *testing.T) {
	small := []FileTouch{ft("src/a.go", "read"), ft("src/b.go", "read"), ft("src/c.go", "edited"), ft("README.md", "read")}
	deep := []FileTouch{
		ft("a/b/c/x.go", "read"), ft("a/b/c/y.go", "read"), ft("a/b/d/z.go", "edited"),
		ft("a/e.go", "read"), ft("/abs/p/q.txt", "read"), ft("top.md", "created"), group("old/dir/", "read", 5),
	}
	tests := []struct {
		name   string
		files  []FileTouch
		budget int
		want   []string
	}{
		{"each on its own when it fits", small, 1000, []string{"src/a.go (read)", "src/b.go (read)", "src/c.go (edited)", "README.md (read)"}},
		{"braced by directory and action", small, 70, []string{"src/{a.go,b.go} (read)", "src/c.go (edited)", "README.md (read)"}},
		{"fits whole", deep, 150, []string{"a/b/c/x.go (read)", "a/b/c/y.go (read)", "a/b/d/z.go (edited)", "a/e.go (read)", "/abs/p/q.txt (read)", "top.md (created)", "old/dir/** (read; 5 files)"}},
		{"braced", deep, 140, []string{"a/b/c/{x.go,y.go} (read)", "a/b/d/z.go (edited)", "a/e.go (read)", "/abs/p/q.txt (read)", "top.md (created)", "old/dir/** (read; 5 files)"}},
		{"the deepest directories fold first", deep, 120, []string{"a/b/** (edited; 3 files)", "a/e.go (read)", "/abs/** (read; 1 file)", "top.md (created)", "old/dir/** (read; 5 files)"}},
		{"then the next level", deep, 110, []string{"a/** (edited; 3 files)", "a/e.go (read)", "/** (read; 1 file)", "top.md (created)", "old/** (read; 5 files)"}},
		{"then the working directory", deep, 66, []string{"./** (edited; 9 files)", "/** (read; 1 file)", "top.md (created)"}},
		{"then the roots", deep, 60, []string{"./** (created; 10 files)", "/** (read; 1 file)"}},
		{"the roots even past the budget", deep, 10, []string{"./** (created; 10 files)", "/** (read; 1 file)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FileItems(tt.files, tt.budget, 3)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("FileItems(budget %d) = %q, want %q", tt.budget, got, tt.want)
			}
		})
	}
}

// Whatever its size, a rendered list stays within its bound and, read
// back, names or covers every file it was given, and a list read back and
// rendered again covers as much.
func TestRenderedListCoversEveryFile(t *testing.T) {
	for _, n := range []int{1, 50, 300, 2000, 20000} {
		var files []FileTouch
		for i := range n {
			p := fmt.Sprintf("repo/pkg%d/sub%d/name%d/file%05d.go", i%13, i%7, i%3, i)
			switch i % 5 {
			case 1:
				p = fmt.Sprintf("/testbed/lib%d/m%05d.py", i%4, i)
			case 2:
				p = fmt.Sprintf("f%05d.txt", i)
			}
			files = append(files, ft(p, []string{"read", "edited", "created"}[i%3]))
		}
		summary := RenderFilesTouched(files)
		marker := MarkerFiles(files, 2000)
		if len(summary) > len(FilesTouchedHeading)+MaxFileListChars || len(marker) > len(MarkerFilesHeading)+2000 {
			t.Fatalf("%d files: summary list %d bytes, marker %d", n, len(summary), len(marker))
		}
		again := RenderFilesTouched(filesFromList("x\n\n" + summary))
		for _, text := range []string{summary, marker, again} {
			listed := filesFromList(text)
			for _, f := range files {
				if !slices.ContainsFunc(listed, func(l FileTouch) bool { return l.Covers(f.Path) }) {
					t.Fatalf("%d files: %s is neither named nor covered by\n%s", n, f.Path, text)
				}
			}
		}
	}
	if RenderFilesTouched(nil) != "" || MarkerFiles(nil, 100) != "" {
		t.Error("an empty list renders a heading")
	}
}
