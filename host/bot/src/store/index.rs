//! The embedded index's posts: stored a feed page at a time, read by URI, by parent,
//! by thread, and the ones that name the bot in index order.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{IndexChange, IndexedPost, Result, Store, now_secs};

const INDEX_COLUMNS: &str = "SELECT seq, uri, author, post_id, content, kind, parent_uri, \
                             mentions_bot FROM index_posts";

fn indexed_post(r: &AnyRow) -> Result<IndexedPost> {
    Ok(IndexedPost {
        seq: r.try_get(0)?,
        uri: r.try_get(1)?,
        author: r.try_get(2)?,
        post_id: r.try_get(3)?,
        content: r.try_get(4)?,
        kind: r.try_get(5)?,
        parent_uri: r.try_get(6)?,
        mentions_bot: r.try_get::<i64, _>(7)? != 0,
    })
}

impl Store {
    /// Applies a page of the feed (posts written, posts deleted) and moves the
    /// follower's position past it, in one transaction (one commit per page, and a
    /// crash keeps either all of it or none); fenced. An edit replaces the post and
    /// takes a new place in the order, so an edit that adds a mention is seen.
    pub async fn index_apply(
        &self,
        changes: &[IndexChange],
        position_name: &str,
        position: &str,
    ) -> Result<()> {
        let token = self.fence.current()?;
        let _t = self.timed();
        let mut tx = self.pool.begin().await?;
        self.check_fence_in(&mut tx, token).await?;
        for change in changes {
            match change {
                IndexChange::Put(post) => {
                    sqlx::query("DELETE FROM index_posts WHERE uri = $1")
                        .bind(&post.uri)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "INSERT INTO index_posts (uri, author, post_id, content, kind, \
                         parent_uri, mentions_bot, indexed_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    )
                    .bind(&post.uri)
                    .bind(&post.author)
                    .bind(&post.post_id)
                    .bind(&post.content)
                    .bind(&post.kind)
                    .bind(&post.parent_uri)
                    .bind(i64::from(post.mentions_bot))
                    .bind(now_secs())
                    .execute(&mut *tx)
                    .await?;
                }
                IndexChange::Delete(uri) => {
                    sqlx::query("UPDATE index_posts SET deleted = 1 WHERE uri = $1")
                        .bind(uri)
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        sqlx::query(
            "INSERT INTO positions (name, position, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET position = excluded.position, \
             updated_at = excluded.updated_at",
        )
        .bind(position_name)
        .bind(position)
        .bind(now_secs())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn index_post(&self, uri: &str) -> Result<Option<IndexedPost>> {
        let _t = self.timed();
        let row = sqlx::query(&format!("{INDEX_COLUMNS} WHERE uri = $1 AND deleted = 0"))
            .bind(uri)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(indexed_post).transpose()
    }

    /// Posts replying to `uri`, oldest first.
    pub async fn index_replies(&self, uri: &str, limit: u32) -> Result<Vec<IndexedPost>> {
        let _t = self.timed();
        let rows = sqlx::query(&format!(
            "{INDEX_COLUMNS} WHERE parent_uri = $1 AND deleted = 0 ORDER BY post_id LIMIT $2"
        ))
        .bind(uri)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(indexed_post).collect()
    }

    /// Every post under `root` (replies, replies to replies, ... down to `max_depth`),
    /// oldest first, at most `limit`; not the root itself.
    ///
    /// The walk carries whole rows, so each post is read once (by the parent index) and
    /// not looked up again by its URI afterwards: a summary reads its thread per
    /// mention, and this was the bot's costliest statement under load (docs/BENCHMARKS.md).
    /// `UNION ALL` keeps no set of rows seen; a post edited into a cycle is bounded by
    /// the depth and read once here.
    pub async fn index_descendants(
        &self,
        root: &str,
        max_depth: u32,
        limit: u32,
    ) -> Result<Vec<IndexedPost>> {
        let _t = self.timed();
        let rows = sqlx::query(&format!(
            "WITH RECURSIVE thread AS ( \
                 SELECT seq, uri, author, post_id, content, kind, parent_uri, mentions_bot, \
                        deleted, 0 AS depth \
                 FROM index_posts WHERE parent_uri = $1 \
                 UNION ALL \
                 SELECT p.seq, p.uri, p.author, p.post_id, p.content, p.kind, p.parent_uri, \
                        p.mentions_bot, p.deleted, t.depth + 1 \
                 FROM {} WHERE t.depth < $2) \
             SELECT seq, uri, author, post_id, content, kind, parent_uri, mentions_bot \
             FROM thread WHERE deleted = 0 ORDER BY post_id, depth LIMIT $3",
            self.dialect.children_of_walk()
        ))
        .bind(root)
        .bind(i64::from(max_depth))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let mut seen = std::collections::HashSet::with_capacity(rows.len());
        let mut posts = Vec::with_capacity(rows.len());
        for row in &rows {
            let post = indexed_post(row)?;
            if seen.insert(post.uri.clone()) {
                posts.push(post);
            }
        }
        Ok(posts)
    }

    /// Posts naming the bot, after position `seq`, in index order.
    pub async fn index_mentions_after(&self, seq: i64, limit: u32) -> Result<Vec<IndexedPost>> {
        let _t = self.timed();
        let rows = sqlx::query(&format!(
            "{INDEX_COLUMNS} WHERE mentions_bot = 1 AND seq > $1 AND deleted = 0 \
             ORDER BY seq LIMIT $2"
        ))
        .bind(seq)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(indexed_post).collect()
    }
}
