package vmfork

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"testing"
)

// docRef is a `path/file.go:Name` or `path/file.go:Type.Method` in a doc.
var docRef = regexp.MustCompile(`([A-Za-z0-9_./-]+\.go):([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)`)

// TestArchitectureDoc keeps docs/ARCHITECTURE.md true: every file it names
// with a function, method or type exists and declares it.
func TestArchitectureDoc(t *testing.T) {
	doc, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	refs := docRef.FindAllStringSubmatch(string(doc), -1)
	// A test that finds nothing to check could not fail.
	if len(refs) < 40 {
		t.Fatalf("docs/ARCHITECTURE.md: %d file:function references, want the pipeline's (at least 40)", len(refs))
	}
	decls := map[string]map[string]bool{}
	for _, r := range refs {
		file, name := r[1], r[2]
		names, ok := decls[file]
		if !ok {
			names, err = declaredNames(file)
			if err != nil {
				t.Errorf("docs/ARCHITECTURE.md names %s: %v", r[0], err)
			}
			decls[file] = names
		}
		if names != nil && !names[name] {
			t.Errorf("docs/ARCHITECTURE.md names %s: %s declares no %s", r[0], file, name)
		}
	}
}

// declaredNames returns the top-level names file declares: functions,
// types, vars and consts by name, methods as Type.Method.
func declaredNames(file string) (map[string]bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				names[d.Name.Name] = true
				continue
			}
			typ := d.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if g, ok := typ.(*ast.IndexExpr); ok { // a generic receiver
				typ = g.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				names[id.Name+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					names[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
	return names, nil
}
