//! A test guest that exports the wrong world: a bare, unversioned `authorize` function
//! instead of the `homeserver:guest/policy@0.1.0` interface. Loading it into any slot
//! must fail with a clear error.

wit_bindgen::generate!({
    inline: "
        package homeserver:wrong;
        world wrong {
            export authorize: func(path: string) -> bool;
        }
    ",
    world: "wrong",
});

struct Wrong;

impl Guest for Wrong {
    fn authorize(_path: String) -> bool {
        true
    }
}

export!(Wrong);
