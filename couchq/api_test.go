package couchq_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxExported bounds the package's exported declarations, methods
// included: every one is a promise kept forever, so the machinery lives in
// internal/protocol and this package shows what applications call.
const maxExported = 110

// The public API stays small, and every exported name says what it is.
func TestPublicAPIIsSmallAndDocumented(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	var names []string
	undocumented := func(name string, docs ...*ast.CommentGroup) {
		for _, d := range docs {
			if d != nil && strings.TrimSpace(d.Text()) != "" {
				return
			}
		}
		t.Errorf("%s has no doc comment", name)
	}
	for _, file := range files {
		for _, decl := range file.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				name := d.Name.Name
				if d.Recv != nil {
					recv := d.Recv.List[0].Type
					if star, ok := recv.(*ast.StarExpr); ok {
						recv = star.X
					}
					if !recv.(*ast.Ident).IsExported() {
						continue
					}
					name = recv.(*ast.Ident).Name + "." + name
				}
				names = append(names, name)
				undocumented(name, d.Doc)
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
							undocumented(s.Name.Name, s.Doc, d.Doc)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
								undocumented(n.Name, s.Doc, s.Comment, d.Doc)
							}
						}
					}
				}
			}
		}
	}
	if len(names) > maxExported {
		t.Errorf("package couchq exports %d names, more than %d: %v", len(names), maxExported, names)
	}
	t.Logf("package couchq exports %d names", len(names))
}
